"""Step costs: what one pass of a target or a drafter costs per row count and numerics, and what the
numerics lose against fp32 — what the draft-width policy trades off.

    python benchmarks/bench_costs.py [--context 300] [--repeats 7] [--threads 1]
        [--models smollm2,qwen3.5,lfm2,lfm2-moe,gpt-oss,gemma4-moe] [--isas amx,avx512vnni]
        [--schemes int8,int4,int4-a8] [--breakdown] [--name NAME] [--json]
    python benchmarks/bench_costs.py verify-cost | kernel-ab --base REV | moe-width | state-rollback | fidelity | dot-floor
        | hugepages

With no sub-command: step cost per row count, per numerics, in one run.
Target: one SmolLM2 pass over R new rows (R = 1, 2, 4, 8, 9, 16) after a `--context`-token
prefill, in bf16 with the row-invariant kernels (what ships), bf16 with plain SDPA/F.linear
(not row-invariant: for comparison), fp32, and weight-only int8 / int4 (bf16 activations).
Drafter: one block pass of each shipped drafter (context already written) in bf16 and in int4 (its
target's numerics: what the default command runs), logits over the first R rows.
Family-shaped targets (`harness.shaped_configs`: random Qwen3.5, LFM2, LFM2-MoE, gpt-oss and Gemma 4 MoE shapes) in
bf16 and int4: one pass over R rows plus the state commit, once keeping every row and once keeping half of them (a rejection's
rollback: the DeltaNet state replayed over the kept rows, the conv rows and sliding windows gathered). For the
MoE shapes the R rows read up to R x top-k distinct experts: what verifying a block costs there.
`--breakdown` adds, per int4 target, where a 1-row and a 9-row pass spend their time (`step_parts.py`:
linear layers, LM head, attention, DeltaNet recurrence, convolutions, the state commit, the rest), one
block pass of a 1-layer DSpark drafter (block 8) in the target's numerics, and its greedy Markov chain.
`--schemes` picks the weight-only series (default int8,int4; int4-a8: int4 with 8-bit activations; the
family shapes take the int4 ones). `--isas` times the int4 and int8 series once per instruction set of the int4 kernel (the first is the
unsuffixed series; the others are suffixed `[isa]`; all give the same bits), so a tile path and the
VNNI path are compared in one run. `--json` prints one JSON object: each series mapping row counts to
median ms, and the instruction set the int4 kernel ran (`isa`).
Medians of `--repeats`; every configuration is timed in the same process, interleaved by repeat.
Writes benchmarks/results/costs.json and docs/data/costs.png (`--models qwen3.5` alone: costs_qwen3_5.*; other
family shapes without smollm2: costs_families.*; `--name NAME`: NAME.*).

Sub-commands (`bench_costs.py COMMAND --help` for each):
  verify-cost     one SmolLM2 pass over r rows vs one row, ours and transformers (verify_cost.json)
  kernel-ab       the C kernels as they are vs at another commit, paired by round (kernel_ab.json)
  moe-width       verify cost growth on the family shapes, and the width the policy picks (moe_width.*)
  state-rollback  a DeltaNet layer's two rollbacks after a verify: replay vs per-row states (state_rollback.json)
  fidelity        each numerics' top-1 agreement and KL against fp32, teacher-forced (fidelity.json)
  dot-floor       the VNNI dot products an int4 pass must issue, over this machine's measured peak (dot_floor.json)
  hugepages       packed weights on 2 MiB pages vs 4 KiB pages, paired by round (hugepages.json / .png)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from harness import (FIGURES, ROOT, add_prompts, add_repeats, add_threads, chat_prompts, clock, hybrid_step,
                     new_figure, run_commands, save_figure, shaped, shaped_configs, side_by_side, write_json,
                     write_results)

ROWS = (1, 2, 4, 8, 9, 16)


BREAKDOWN_ROWS = (1, 9)


def step_breakdown(targets: dict, caches: dict, hybrid: dict, args, g) -> dict:
    """{int4 target: {rows: {part: median ms}}} for `BREAKDOWN_ROWS`-row passes, and the block pass of a
    1-layer DSpark drafter (block 8) built for the target, in its numerics, then its greedy Markov chain
    over the block's logits (one W2 · W1[previous token] bias over the vocabulary per slot)."""
    from step_parts import pass_parts
    from blockdraft.checkpoints.publish import new_drafter
    from blockdraft.drafters.dspark import greedy_chain
    from blockdraft.layers.quant import quantize_drafter, scheme_of

    out = {}
    chosen = {n: (t, caches[n]) for n, (t, _) in targets.items() if n in ("int4 weight-only", "int4-a8 weight-only")}
    chosen |= {n.split(",")[0]: hc for n, hc in hybrid.items()
               if (" int4, all rows kept" in n or " int4-a8, all rows kept" in n) and not n.endswith("]")}
    for name, (t, cache) in chosen.items():
        context = cache.length
        per = {}
        for rows in BREAKDOWN_ROWS:
            ids = torch.randint(0, t.config.vocab_size, (1, rows), generator=g)
            per[rows] = pass_parts(lambda: t(ids, cache), lambda: cache.truncate(context), t, args.repeats)
        n = t.config.num_layers
        d = quantize_drafter(new_drafter(t, "dspark", 1, 8, (1, n // 2, n - 2), mask_token_id=0, markov_rank=128),
                             scheme_of(t))
        dc = d.new_cache(1, context + 32)
        prompt = torch.randint(0, t.config.vocab_size, (1, context), generator=g)
        d.extend_context(t(prompt, t.new_cache(1, context + 32), d.config.taps).taps, dc)
        anchor = torch.tensor([int(prompt[0, -1])])
        per["drafter block (1-layer DSpark, block 8)"] = pass_parts(
            lambda: d.logits(d.block_hidden(anchor, 8, dc)), lambda: None, d, args.repeats)
        logits = d.logits(d.block_hidden(anchor, 8, dc))                      # [1, 8, vocab]
        per["drafter Markov chain (greedy, 8 slots)"] = pass_parts(
            lambda: greedy_chain(logits, anchor, d.markov_head), lambda: None, d, args.repeats)
        out[name] = per
    return out


def _isa_of(series: str, isas: list[str]) -> str:
    """The instruction set a series runs on: its `[isa]` suffix, else the first of `isas`."""
    return series[series.rindex("[") + 1:-1] if series.endswith("]") else isas[0]


def cost_flags(ap) -> None:
    ap.add_argument("--context", type=int, default=300)
    add_repeats(ap, 7)
    add_threads(ap, 1)
    ap.add_argument("--isas", default=None, help="instruction sets for the quantized series, best first "
                    "(none: the best this CPU runs); e.g. amx,avx512vnni")
    ap.add_argument("--name", default=None, help="results name (benchmarks/results/NAME.json, docs/data/NAME.png); "
                    "default by --models: costs, costs_qwen3_5 or costs_families")
    ap.add_argument("--breakdown", action="store_true", help="per-part times of 1- and 9-row int4 passes")
    ap.add_argument("--schemes", default="int8,int4", help="weight-only series: int8, int4, int4-a8")
    ap.add_argument("--json", action="store_true", help="print one JSON object (series -> rows -> ms, isa)")
    ap.add_argument("--models", default="smollm2,qwen3.5", help="smollm2 (every numerics, drafters), and the "
                    "family-shaped random targets: qwen3.5, lfm2, lfm2-moe, gpt-oss, gemma4-moe")


def costs(args) -> int:
    """Step cost per row count, per numerics (the default: no sub-command)."""
    models = set(args.models.split(","))

    import blockdraft.layers.attention as attention
    import blockdraft.layers.linear as linear
    from blockdraft.layers import cpu_kernels
    from blockdraft.default_model import smollm2_dir
    from blockdraft.llm import resolve_drafter_dir
    from blockdraft.loading import load_drafter, load_target
    from blockdraft.numerics import cpu_flags, cpu_model, native_bf16

    best_isa = cpu_kernels.best_isa()
    isas = args.isas.split(",") if args.isas else [best_isa]
    unknown = [i for i in isas if i not in cpu_kernels.ISAS or cpu_kernels.ISAS[i] > cpu_kernels.ISAS[best_isa]]
    if unknown:
        sys.exit(f"--isas {args.isas}: this CPU runs {[i for i in cpu_kernels.ISAS if cpu_kernels.ISAS[i] <= cpu_kernels.ISAS[best_isa]]}")

    def isa_series(name: str, isa: str) -> str:
        return name if isa == isas[0] else f"{name} [{isa}]"

    def run_on(isa: str) -> None:      # the int4/int8 kernels take `best_isa()` wherever no isa is given
        cpu_kernels.best_isa = lambda: isa

    stable_attn = attention._row_stable
    plain_attn = (lambda q, k, v, vis, scale, g:
                  F.scaled_dot_product_attention(q, k, v, attn_mask=vis, scale=scale, enable_gqa=g > 1))

    def use(stable: bool) -> None:
        attention._row_stable = stable_attn if stable else plain_attn
        linear.ROW_CHUNK = 16 if stable else 10 ** 9

    targets = {}
    if "smollm2" in models:
        targets = {"bf16 row-invariant": (load_target(smollm2_dir(), "bfloat16"), True),
                   "bf16 plain (SDPA)": (None, False), "fp32": (load_target(smollm2_dir(), "float32"), True)}
        targets["bf16 plain (SDPA)"] = (targets["bf16 row-invariant"][0], False)
        for scheme in args.schemes.split(","):      # weight-only, bf16 activations, row-invariant kernels
            quantized = load_target(smollm2_dir(), "bfloat16", scheme)
            for isa in isas:
                targets[isa_series(f"{scheme} weight-only", isa)] = (quantized, True)
    hybrid = {}
    from blockdraft.layers.quant import quantize_target
    for family, cfg in shaped_configs().items():
        if family not in models or family == "smollm2":       # smollm2: the real default model above
            continue
        int4s = [s for s in args.schemes.split(",") if s.startswith("int4")]
        for numerics, h in (("bf16", shaped(cfg)), *((s, quantize_target(shaped(cfg), s)) for s in int4s)):
            for kept in ("all rows kept", "half kept (rollback)"):
                for isa in isas if numerics != "bf16" else isas[:1]:
                    hybrid[isa_series(f"{family}-shaped {numerics}, {kept}", isa)] = (h, h.new_cache(1, args.context + 32))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 49152, (1, args.context), generator=g)
    caches = {}
    with torch.inference_mode():
        for name, (t, stable) in targets.items():
            use(stable)
            cache = t.new_cache(1, args.context + 32)
            t(prompt, cache)
            caches[name] = cache
        for name, (h, cache) in hybrid.items():
            h(prompt % h.config.vocab_size, cache)
            cache.truncate(args.context)
        drafters = {}     # each shipped drafter in its target's numerics: bf16, and int4 (what the default runs)
        for kind in ("dspark", "dflash") if "smollm2" in models else ():
            for numerics, target_name in (("bf16", "bf16 row-invariant"), ("int4", "int4 weight-only")):
                t = targets[target_name][0]
                d = load_drafter(resolve_drafter_dir(None, kind), t)
                dc = d.new_cache(1, args.context + 32)
                d.extend_context(t(prompt, t.new_cache(1, args.context + 32), d.config.taps).taps, dc)
                drafters[f"{kind} {numerics}"] = (d, dc)

        times: dict[str, dict[int, list[float]]] = {n: {r: [] for r in ROWS}
                                                    for n in [*targets, *hybrid, *drafters]}
        for _ in range(args.repeats):
            for name, (t, stable) in targets.items():
                use(stable)
                run_on(_isa_of(name, isas))
                for rows in ROWS:
                    caches[name].truncate(args.context)
                    ids = torch.randint(0, 49152, (1, rows), generator=g)
                    t0 = time.perf_counter()
                    t(ids, caches[name])
                    times[name][rows].append(time.perf_counter() - t0)
            use(True)
            for name, (h, cache) in hybrid.items():
                run_on(_isa_of(name, isas))
                for rows in ROWS:
                    ids = torch.randint(0, h.config.vocab_size, (1, rows), generator=g)
                    keep = rows if "all rows" in name else (rows + 1) // 2
                    times[name][rows].append(hybrid_step(h, cache, ids, args.context, keep))
            run_on(isas[0])
            for kind, (d, dc) in drafters.items():
                anchor = torch.tensor([int(prompt[0, -1])])
                for rows in ROWS:
                    t0 = time.perf_counter()
                    hidden = d.block_hidden(anchor, d.config.block_size, dc)
                    d.logits(hidden[:, :rows])
                    times[kind][rows].append(time.perf_counter() - t0)
        breakdown = step_breakdown(targets, caches, hybrid, args, g) if args.breakdown else None
    use(True)
    run_on(best_isa)
    report = {"context": args.context, "threads": args.threads, "repeats": args.repeats, "cpu": cpu_model(),
              "isa": isas[0], "cpu_native_bf16": native_bf16(), "amx": "amx_bf16" in cpu_flags(),
              "ms": {n: {r: 1e3 * statistics.median(v) for r, v in per.items()} for n, per in times.items()}}
    report["ratio_vs_1_row"] = {n: {r: v / per[1] for r, v in per.items()} for n, per in report["ms"].items()}
    if breakdown:
        report["breakdown_ms"] = breakdown
    # the family-shaped targets alone get their own files: Qwen3.5's, and the others'
    name = args.name or ("costs" if "smollm2" in models else "costs_qwen3_5" if models == {"qwen3.5"}
                         else "costs_families")
    write_results(name, report)
    if args.json:
        print(json.dumps({"isa": report["isa"], "cpu": report["cpu"], "threads": args.threads,
                          "context": args.context, **{n: {str(r): v for r, v in per.items()}
                                                      for n, per in report["ms"].items()},
                          **({"breakdown_ms": breakdown} if breakdown else {})}))
    else:
        print(json.dumps(report["ms"], indent=1))
    if made := new_figure(figsize=(7, 3.8)):
        fig, ax = made
        for series, per in report["ms"].items():
            ax.plot(list(per), list(per.values()), marker="o", label=series if series in targets or series in hybrid
                    else f"drafter {series} (block, logits rows)")
        ax.set_xlabel("rows in the pass")
        ax.set_ylabel("ms (median)")
        ax.set_title(f"step cost, context {args.context}, {args.threads} thread(s)")
        ax.legend(fontsize=8)
        save_figure(fig, name)
    return 0


# --- verify-cost ---------------------------------------------------------------------------------

VERIFY_CONTEXT = list(range(100, 160))


def verify_cost_flags(ap) -> None:
    add_threads(ap, None)
    ap.add_argument("--runs", type=int, default=5, help="timed runs per row count (the fastest counts)")


@torch.inference_mode()
def verify_cost(args) -> None:
    """What a verify pass costs on this machine: one target forward over r rows vs one row, SmolLM2-135M.

    Speculation pays only if `mean AL > cost(k + 1 rows) / cost(1 row) + cost(draft) / cost(1 row)`.
    Ours and transformers side by side, fp32 and bf16, r = 1, 2, 3, 5, 9 after a 60-token context;
    minimum of `--runs` runs each. Writes benchmarks/results/verify_cost.json.
    """
    from transformers import AutoModelForCausalLM

    from blockdraft.default_model import smollm2_dir
    from blockdraft.loading import load_target

    def best_ms(fn) -> float:
        return 1e3 * min(clock(fn)[0] for _ in range(args.runs))

    report = {}
    for dtype in ("float32", "bfloat16"):
        ours = load_target(smollm2_dir(), dtype)
        cache = ours.new_cache(1, 256)
        ours(torch.tensor([VERIFY_CONTEXT]), cache)
        hf = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=getattr(torch, dtype)).eval()
        pkv = hf(torch.tensor([VERIFY_CONTEXT]), use_cache=True).past_key_values
        rows = {}
        for r in (1, 2, 3, 5, 9):
            ids = torch.full((1, r), 100)

            def ours_step():
                cache.truncate(len(VERIFY_CONTEXT))
                ours(ids, cache)

            def hf_step():
                extra = pkv.get_seq_length() - len(VERIFY_CONTEXT)
                if extra > 0:
                    pkv.crop(-extra)                    # back to the 60-token context
                hf(ids, past_key_values=pkv, use_cache=True)

            rows[r] = {"ours_ms": best_ms(ours_step), "hf_ms": best_ms(hf_step)}
        for r in rows:
            rows[r]["ours_vs_1_row"] = rows[r]["ours_ms"] / rows[1]["ours_ms"]
            rows[r]["hf_vs_1_row"] = rows[r]["hf_ms"] / rows[1]["hf_ms"]
        report[dtype] = rows
        print(dtype, json.dumps(rows, indent=1))
    write_results("verify_cost", report)


# --- kernel-ab -----------------------------------------------------------------------------------

KERNEL_SOURCE = "src/blockdraft/layers/cpu_kernels.c"


def rows_ms(target, cache, context: int, ids: dict[int, torch.Tensor]) -> dict[int, float]:
    """Mean ms of one pass over each `ids[rows]` [1, rows] after the cache's first `context` positions."""
    out = {}
    for rows, block in ids.items():
        steps = max(4, 40 // rows)

        def run():
            for _ in range(steps):
                cache.truncate(context)
                target(block, cache)
        out[rows] = clock(run)[0] / steps * 1e3
    return out


def kernel_ab_flags(ap) -> None:
    ap.add_argument("--base", required=True, help="the commit whose kernels are compared")
    ap.add_argument("--rows", default="1,9")
    add_repeats(ap, 16)
    add_threads(ap, 1)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--model", default="smollm2", help="smollm2 (the default model), or a family-shaped random "
                    "target: qwen3.5, lfm2")
    ap.add_argument("--quantization", default="int4", choices=("int4", "int4-a8", "int8"))
    ap.add_argument("--isa", default=None, help="the kernel path both builds run (default: the best this CPU "
                    "runs); e.g. avx2 to time the AVX2 path on an AVX512 machine")


def kernel_ab(args) -> None:
    """Two builds of the CPU kernels side by side in one process: a quantized target's step time per row
    count with `layers/cpu_kernels.c` as it is and as it was at another commit, paired by round.

    Both builds run the same Python, weights and cache; each round times every row count with each build
    (in alternating order), a mean over several steps each, and the ratio is taken within the round (this
    machine drifts by 10-20% over minutes; a whole-process A/B cannot see a 5% change). The two builds' C
    must take the same `bd_layers` arguments. Writes benchmarks/results/kernel_ab.json.
    """
    rows_list = [int(r) for r in args.rows.split(",")]
    from blockdraft.default_model import smollm2_dir
    from blockdraft.layers import cpu_kernels
    from blockdraft.loading import load_target

    with tempfile.TemporaryDirectory() as tmp:
        base_source = Path(tmp) / "cpu_kernels.c"
        base_source.write_text(subprocess.run(["git", "show", f"{args.base}:{KERNEL_SOURCE}"], cwd=ROOT, check=True,
                                              capture_output=True, text=True).stdout)
        libs = {}
        for name, source in (("base", base_source), ("head", ROOT / KERNEL_SOURCE)):
            cpu_kernels.SOURCE = source
            cpu_kernels.library.cache_clear()
            libs[name] = cpu_kernels.library()
            if libs[name] is None:
                sys.exit(f"the {name} kernels do not build here")
    chosen = [libs["head"]]
    cpu_kernels.library = lambda: chosen[0]
    if args.isa is not None:
        runs = [i for i in cpu_kernels.ISAS if cpu_kernels.ISAS[i] <= cpu_kernels.ISAS[cpu_kernels.best_isa()]]
        if args.isa not in runs:
            sys.exit(f"--isa {args.isa}: this CPU runs {runs}")
        cpu_kernels.best_isa = lambda: args.isa            # the int4/int8 kernels take it where no isa is given

    if args.model == "smollm2":
        target = load_target(smollm2_dir(), "bfloat16", args.quantization)
    elif args.model in ("qwen3.5", "lfm2"):
        from blockdraft.layers.quant import quantize_target
        target = quantize_target(shaped(shaped_configs()[args.model]), args.quantization)
    else:
        sys.exit(f"--model {args.model}: smollm2, qwen3.5 or lfm2")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (1, args.context), generator=g)
    with torch.inference_mode():
        cache = target.new_cache(1, args.context + max(rows_list))
        target(prompt, cache)

        def build_ms(name: str) -> dict[int, float]:
            """One round of one build: mean ms of a step at each row count."""
            chosen[0] = libs[name]
            return rows_ms(target, cache, args.context,
                           {rows: torch.randint(0, target.config.vocab_size, (1, rows), generator=g) for rows in rows_list})

        by_round = side_by_side({name: lambda name=name: build_ms(name) for name in libs}, args.repeats)
    ms = {name: {r: [x[r] for x in per] for r in rows_list} for name, per in by_round.items()}
    report = {"base": args.base, "model": args.model, "quantization": args.quantization,
              "isa": args.isa or cpu_kernels.best_isa(), "threads": args.threads,
              "context": args.context, "rounds": args.repeats, "ms": ms, "rows": {}}
    for rows in rows_list:
        ratios = [h / b for h, b in zip(ms["head"][rows], ms["base"][rows])]
        report["rows"][rows] = {"base_ms": statistics.median(ms["base"][rows]),
                                "head_ms": statistics.median(ms["head"][rows]),
                                "head_over_base": statistics.median(ratios), "range": [min(ratios), max(ratios)]}
        r = report["rows"][rows]
        print(f"{rows:2d} rows: base {r['base_ms']:6.2f} ms, head {r['head_ms']:6.2f} ms, head/base per round: "
              f"median {r['head_over_base']:.3f} ({r['range'][0]:.3f}-{r['range'][1]:.3f})")
    write_results("kernel_ab", report)


def hugepages_flags(ap) -> None:
    ap.add_argument("--models", default="lfm2,smollm2", help="smollm2 (the default model), or family-shaped "
                    "random targets: qwen3.5, lfm2")
    ap.add_argument("--rows", default="1,9")
    ap.add_argument("--quantization", default="int4", choices=("int4", "int4-a8", "int8"))
    add_repeats(ap, 12)
    add_threads(ap, 2)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--name", default="hugepages", help="results as benchmarks/results/NAME.json, docs/data/NAME.png")


def hugepages(args) -> None:
    """Packed weights on 2 MiB pages (`layers/hugepages.py`) against the same weights on 4 KiB pages, side by
    side in one process: two copies of each target, quantized once with the huge-page copy on and once with
    it off, each step timed on each copy in alternating order and the ratio taken within the round (this
    machine drifts by 10-20% over minutes). Reports per model and row count the median ms of both and the
    median per-round ratio, the bytes of packed weights each copy holds on huge pages (from
    /proc/self/smaps: AnonHugePages of the mappings holding them), and whether both copies' logits are
    bit-identical. Writes benchmarks/results/NAME.json and docs/data/NAME.png (`--name`, default hugepages)."""
    from blockdraft.default_model import smollm2_dir
    from blockdraft.layers import cpu_kernels, hugepages as pages
    from blockdraft.layers.quant import QuantizedLinear, quantize_target
    from blockdraft.loading import load_target
    from blockdraft.numerics import cpu_model

    rows_list = [int(r) for r in args.rows.split(",")]
    if bad := [m for m in args.models.split(",") if m not in ("smollm2", "qwen3.5", "lfm2")]:
        raise SystemExit(f"--models {','.join(bad)}: smollm2, qwen3.5 or lfm2")

    def build(name: str, on: bool):
        pages.ENABLED = on
        try:
            if name == "smollm2":
                return load_target(smollm2_dir(), "bfloat16", args.quantization)
            return quantize_target(shaped(shaped_configs()[name]), args.quantization)
        finally:
            pages.ENABLED = True

    def packed(model) -> list[torch.Tensor]:
        """The model's packed weights and scales (the layers on the own kernel)."""
        return [t for m in model.modules() if isinstance(m, QuantizedLinear) and m.kernel == "qgemm"
                for t in (m.qweight, m.scales)]

    def huge_bytes(model) -> int:
        """Bytes of the model's packed weights that lie in mappings the kernel backs with huge pages."""
        spans = {span: kb * 1024 for span, kb in pages.mapping_fields("AnonHugePages").items() if kb}
        return sum(next((min(b, t.numel() * t.element_size()) for (lo, hi), b in spans.items()
                         if lo <= t.data_ptr() < hi), 0) for t in packed(model))

    report = {"cpu": cpu_model(), "isa": cpu_kernels.best_isa(), "threads": args.threads,
              "quantization": args.quantization, "context": args.context, "rounds": args.repeats, "models": {}}
    g = torch.Generator().manual_seed(0)
    for name in args.models.split(","):
        copies = {"2 MiB pages": build(name, True), "4 KiB pages": build(name, False)}
        vocab = copies["2 MiB pages"].config.vocab_size
        prompt = torch.randint(0, vocab, (1, args.context), generator=g)
        with torch.inference_mode():
            caches, logits = {}, {}
            for label, target in copies.items():
                caches[label] = target.new_cache(1, args.context + max(rows_list))
                logits[label] = target(prompt, caches[label]).logits

            ids = {rows: torch.randint(0, vocab, (1, rows), generator=g) for rows in rows_list}
            per_round = side_by_side({label: lambda label=label: rows_ms(copies[label], caches[label], args.context, ids)
                                      for label in copies}, args.repeats)
        entry = {"huge_page_bytes": {label: huge_bytes(t) for label, t in copies.items()},
                 "packed_bytes": sum(t.numel() * t.element_size() for t in packed(copies["4 KiB pages"])),
                 "logits_equal": torch.equal(*logits.values()), "rows": {}}
        for rows in rows_list:
            huge = [x[rows] for x in per_round["2 MiB pages"]]
            small = [x[rows] for x in per_round["4 KiB pages"]]
            ratios = [a / b for a, b in zip(huge, small)]
            entry["rows"][rows] = {"huge_ms": statistics.median(huge), "small_ms": statistics.median(small),
                                   "huge_over_small": statistics.median(ratios), "range": [min(ratios), max(ratios)],
                                   "ratios": ratios}
            r = entry["rows"][rows]
            print(f"{name} {rows} rows: 2 MiB pages {r['huge_ms']:.2f} ms, 4 KiB {r['small_ms']:.2f} ms, per round "
                  f"{r['huge_over_small']:.3f} ({r['range'][0]:.3f}-{r['range'][1]:.3f})", file=sys.stderr, flush=True)
        report["models"][name] = entry
        del copies, caches
    write_results(args.name, report)
    if made := new_figure(figsize=(6, 3.2)):
        fig, ax = made
        labels = [f"{m}\n{r} row{'s' if r > 1 else ''}" for m in report["models"] for r in rows_list]
        vals = [report["models"][m]["rows"][r]["huge_over_small"] for m in report["models"] for r in rows_list]
        ax.bar(labels, vals, color="tab:blue")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("step time, 2 MiB / 4 KiB pages")
        ax.set_title(f"{args.quantization}, {args.threads} threads, {report['cpu']} ({report['isa']})", fontsize=9)
        save_figure(fig, args.name)
    print(json.dumps({m: {k: v for k, v in e.items() if k != "rows"} | {"rows": {r: {k: round(v, 3) for k, v in x.items()
                      if k != "ratios" and not isinstance(v, list)} for r, x in e["rows"].items()}}
                      for m, e in report["models"].items()}, indent=1))

# --- moe-width -----------------------------------------------------------------------------------

RATES = (0.5, 0.7, 0.85, 0.95)
MAX_WIDTH = 8


def drafter_cost(target, repeats: int, context: int) -> float:
    from blockdraft.checkpoints.publish import new_drafter
    from blockdraft.layers.quant import quantize_drafter, scheme_of
    n = target.config.num_layers
    drafter = new_drafter(target, "dspark", 1, MAX_WIDTH, (1, n // 2, n - 2), mask_token_id=0, markov_rank=64)
    quantize_drafter(drafter, scheme_of(target))     # the target's numerics, as load_drafter
    cache = drafter.new_cache(1, context + 32)
    taps = torch.randn(1, context, 3 * target.config.hidden_size).to(target.dtype)
    drafter.extend_context(taps, cache)

    def block():
        drafter.logits(drafter.block_hidden(torch.tensor([1]), MAX_WIDTH, cache))
    block()                                                                 # warm-up: kernel plans
    return statistics.median(clock(block)[0] for _ in range(repeats))


def choose(target_ms: dict[int, float], draft_ms: float, rate: float) -> tuple[int, float]:
    from blockdraft.engine.policy import DraftWidthPolicy
    policy = DraftWidthPolicy(MAX_WIDTH)
    policy.cost = {(1, w): target_ms[w + 1] + (draft_ms if w else 0.0) for w in range(MAX_WIDTH + 1)}
    trials = 100_000
    policy.trials = [trials] * (MAX_WIDTH + 1)
    policy.hits = [round(trials * rate ** i) for i in range(MAX_WIDTH + 1)]
    policy.since_look[1] = -10 ** 9                     # no exploration: the policy's estimate alone
    width = policy.choose(1)
    speed = policy.expected_tokens(width) / policy.cost[(1, width)] * policy.cost[(1, 0)]
    return width, speed


def moe_width_flags(ap) -> None:
    ap.add_argument("--families", default="lfm2,lfm2-moe,gpt-oss,gemma4-moe")
    ap.add_argument("--numerics", default="int4,bf16")
    add_repeats(ap, 5)
    ap.add_argument("--context", type=int, default=300)
    add_threads(ap, 1)


def moe_width(args) -> None:
    """What speculation buys on MoE targets, and which draft width the policy picks there.

    A verify pass of R rows on a MoE target reads the union of its rows' experts — up to R × top-k of
    them where one row reads top-k — so its cost grows with R faster than a dense target's. For each
    family-shaped random target (`harness.shaped_configs`) this measures, in one process and interleaved
    by repeat: the target's pass over R = 1..9 rows after a `--context`-token prefill, state commit
    included (median of `--repeats`), and one block pass of a 1-layer DSpark drafter of the target's
    width (`new_drafter`, block 8) in the target's numerics. Those costs go into the engine's own
    `DraftWidthPolicy` — cost(width w) = drafter + target(w + 1 rows), cost(0) = target(1 row) — with
    acceptance counts for a per-slot acceptance rate a (slot i accepted with probability a^i); the
    policy's chosen width and its expected speed against plain decoding, E(w)/cost(w) ÷ 1/cost(0), are
    reported per a. `bench_spec.py controlled` runs the engine end to end instead. Random weights: real
    routers spread tokens over experts differently, so a real checkpoint's expert reads, and so its
    costs, can differ. Writes benchmarks/results/moe_width.json and docs/data/moe_width.png.
    """
    from blockdraft.layers import cpu_kernels as kernels
    from blockdraft.layers.quant import quantize_target
    from blockdraft.numerics import cpu_model

    configs = shaped_configs()
    models = {}
    for family in args.families.split(","):
        for numerics in args.numerics.split(","):
            m = shaped(configs[family])
            models[f"{family} {numerics}"] = quantize_target(m, "int4") if numerics == "int4" else m
    report = {"cpu": cpu_model(), "isa": kernels.best_isa(), "threads": args.threads, "context": args.context,
              "repeats": args.repeats, "rates": RATES, "max_width": MAX_WIDTH, "models": {}}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        caches, drafts = {}, {}
        for name, m in models.items():
            cache = m.new_cache(1, args.context + 32)
            m(torch.randint(0, m.config.vocab_size, (1, args.context), generator=g), cache)
            cache.truncate(args.context)
            caches[name] = cache
            drafts[name] = drafter_cost(m, args.repeats, args.context)
        times = {name: {r: [] for r in range(1, MAX_WIDTH + 2)} for name in models}
        for _ in range(args.repeats):
            for name, m in models.items():
                for rows in times[name]:
                    ids = torch.randint(0, m.config.vocab_size, (1, rows), generator=g)
                    times[name][rows].append(hybrid_step(m, caches[name], ids, args.context, rows))
    for name in models:
        target_ms = {r: 1e3 * statistics.median(v) for r, v in times[name].items()}
        draft_ms = 1e3 * drafts[name]
        picks = {str(a): dict(zip(("width", "speed_vs_plain"), choose(target_ms, draft_ms, a))) for a in RATES}
        report["models"][name] = {"target_ms": target_ms, "drafter_ms": draft_ms,
                                  "verify_9_rows_over_1": target_ms[9] / target_ms[1], "policy": picks}
    write_results("moe_width", report)
    print(json.dumps(report["models"], indent=1))
    if made := new_figure(figsize=(7, 3.8)):
        fig, ax = made
        for name, r in report["models"].items():
            ms = r["target_ms"]
            ax.plot(list(ms), [v / ms[1] for v in ms.values()], marker="o", label=name)
        ax.set_xlabel("rows in the verify pass")
        ax.set_ylabel("cost / one-row step")
        ax.set_title(f"verify cost growth, context {args.context}, {args.threads} thread(s)")
        ax.legend(fontsize=8)
        save_figure(fig, "moe_width")


# --- state-rollback ------------------------------------------------------------------------------

def state_rollback_flags(ap) -> None:
    ap.add_argument("--rows", type=int, default=9, help="verified rows (anchor + drafts)")
    ap.add_argument("--keep", type=int, default=3, help="rows each sequence keeps (anchor + accepted)")
    ap.add_argument("--batch", default="1,8", help="batch sizes")
    add_repeats(ap, 20)
    add_threads(ap, None)
    ap.add_argument("--out", default=str((FIGURES / "state_rollback.json").relative_to(ROOT)),
                    help="the report (relative to the repository root)")


def rollback_once(pool, batch: int, rows: int, keep: int, cfg) -> float:
    """Seconds of one DeltaNet layer's recurrence over `rows` rows of `batch` sequences plus the commit of `keep`."""
    from blockdraft.cache.state import LayerRecord
    from blockdraft.layers.deltanet import delta_rule
    g = torch.Generator().manual_seed(0)
    h, dk, dv = cfg.num_v_heads, cfg.k_dim, cfg.v_dim
    q = torch.randn(batch, rows, h, dk, generator=g) * 0.05
    k = torch.randn(batch, rows, h, dk, generator=g) * 0.05
    v = torch.randn(batch, rows, h, dv, generator=g)
    gate, beta = -torch.rand(batch, rows, h, generator=g), torch.rand(batch, rows, h, generator=g)
    rows_in = torch.randn(batch, rows, cfg.conv_dim, generator=g).to(torch.bfloat16)
    slots = list(range(batch))
    t0 = time.perf_counter()
    step = pool.begin(slots, [rows] * batch)
    _, final, per_row = delta_rule(step.rec[0], q, k, v, gate, beta, None, step.keep_states)
    step.record(0, LayerRecord(rows_in, q, k, v, gate, beta, final, per_row))
    pool.commit(step, slots, [keep] * batch)
    return time.perf_counter() - t0


def state_rollback(args) -> None:
    """The two ways a hybrid target's DeltaNet state rolls back after a verify, side by side in one process.

    `replay` records each verified row's inputs (q, k, v, g, beta) and, after a rejection, reruns the
    recurrence over the kept rows from the pre-verify state; `per_row` keeps the state after every verified
    row and picks one. Timed: one DeltaNet layer's recurrence over a verify block plus the commit, at
    Qwen3.5 geometry (16 value heads of 128 x 128), for a batch of sequences that keep `--keep` rows,
    paired by round in alternating order; medians. Writes `--out` (docs/data/state_rollback.json).
    """
    from blockdraft.cache.state import StateLayout, StatePool
    from blockdraft.config import DeltaNetConfig
    from blockdraft.numerics import cpu_model

    cfg = DeltaNetConfig(num_k_heads=16, num_v_heads=16, k_dim=128, v_dim=128, conv_kernel=4)
    results = []
    for batch in (int(b) for b in args.batch.split(",")):
        layout = StateLayout({0: (cfg.conv_kernel - 1, cfg.conv_dim)}, cfg, (0,))
        pools = {mode: StatePool(layout, batch, torch.bfloat16, rollback=mode) for mode in ("replay", "per_row")}
        times = side_by_side({mode: lambda p=pool: rollback_once(p, batch, args.rows, args.keep, cfg)
                              for mode, pool in pools.items()}, args.repeats)
        state_mb = cfg.num_v_heads * cfg.k_dim * cfg.v_dim * 4 / 2**20
        row = {"batch": batch, "rows": args.rows, "keep": args.keep,
               "replay_ms": 1e3 * statistics.median(times["replay"]),
               "per_row_ms": 1e3 * statistics.median(times["per_row"]),
               "replay_extra_mb": batch * state_mb,                       # the working copy
               "per_row_extra_mb": batch * args.rows * state_mb}          # a state per verified row
        results.append(row)
        print(row)
    write_json(ROOT / args.out, {"what": "one DeltaNet layer (16 heads of 128x128): recurrence over a verify block "
                                         "+ commit, medians", "cpu": cpu_model(), "threads": torch.get_num_threads(),
                                 "results": results})


# --- fidelity ------------------------------------------------------------------------------------

def fidelity_flags(ap) -> None:
    add_prompts(ap, 6, 48)
    add_threads(ap, 1)


def fidelity(args) -> None:
    """How close each numerics is to the exact model: top-1 agreement with fp32, teacher-forced.

    For each chat prompt, fp32 decodes greedily; every numerics then scores the same sequence in one
    pass, and at every generated position we compare its argmax with fp32's and measure the KL
    divergence of its next-token distribution from fp32's. The quantized targets run with blockdraft's
    own kernel and, for comparison, PyTorch's (`quantize_target(..., kernel="torch")`); int4-a8 is the
    own kernel's int4 with 8-bit activations (an explicit numerics choice, no PyTorch counterpart).
    Writes benchmarks/results/fidelity.json.
    """
    import blockdraft
    from blockdraft.default_model import smollm2_dir
    from blockdraft.layers.quant import kernels_in, quantize_target, scheme_of
    from blockdraft.loading import load_target

    llm = blockdraft.LLM(drafter="none", dtype="float32")          # the exact model: fp32, unquantized
    exact = llm.target
    prompts, _ = chat_prompts(llm.tokenizer, args.prompts)
    outs = llm.generate(prompt_token_ids=prompts,
                        sampling_params=blockdraft.SamplingParams(max_tokens=args.tokens, ignore_eos=True))
    sequences = [(list(p) + list(o.token_ids), len(p)) for p, o in zip(prompts, outs)]   # fp32 greedy
    with torch.inference_mode():
        reference = [exact.logits(ids)[0, n - 1:-1].double().log_softmax(-1) for ids, n in sequences]

    def quantized(scheme: str, kernel: str | None):
        return quantize_target(load_target(smollm2_dir(), "bfloat16"), scheme, kernel)

    candidates = {"bf16": lambda: load_target(smollm2_dir(), "bfloat16")}
    for scheme in ("int8", "int4"):
        candidates[f"{scheme} (own kernel)"] = lambda s=scheme: quantized(s, None)
        candidates[f"{scheme} (PyTorch kernel)"] = lambda s=scheme: quantized(s, "torch")
    candidates["int4-a8 (own kernel, 8-bit activations)"] = lambda: quantized("int4-a8", None)
    report = {"prompts": args.prompts, "tokens": args.tokens, "numerics": {}}
    for name, make in candidates.items():
        model = make()
        agree, kl = [], []
        with torch.inference_mode():
            for (ids, n), ref in zip(sequences, reference):
                logp = model.logits(ids)[0, n - 1:-1].double().log_softmax(-1)
                agree.append((logp.argmax(-1) == ref.argmax(-1)).double().mean().item())
                kl.append((ref.exp() * (ref - logp)).sum(-1).mean().item())
        report["numerics"][name] = {"top1_agreement_with_fp32": statistics.mean(agree),
                                    "mean_kl_from_fp32": statistics.mean(kl),
                                    "kernel": kernels_in(model) if scheme_of(model) != "none" else None}
        print(f"{name}: top-1 agreement {statistics.mean(agree):.4f}, KL {statistics.mean(kl):.5f}", flush=True)
    write_results("fidelity", report)
    print(json.dumps(report, indent=1))


# --- dot-floor -----------------------------------------------------------------------------------

# 12 independent VPDPBUSD zmm chains in a counted loop: the instruction's throughput on one core
PEAK_SOURCE = r"""
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
    const long iters = 20000000;
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        long n = iters;
        double t0 = now();
        __asm__ volatile(
            "vpxord %%zmm0, %%zmm0, %%zmm0\n vpxord %%zmm1, %%zmm1, %%zmm1\n"
            "1:\n"
            "vpdpbusd %%zmm1, %%zmm0, %%zmm2\n vpdpbusd %%zmm1, %%zmm0, %%zmm3\n vpdpbusd %%zmm1, %%zmm0, %%zmm4\n"
            "vpdpbusd %%zmm1, %%zmm0, %%zmm5\n vpdpbusd %%zmm1, %%zmm0, %%zmm6\n vpdpbusd %%zmm1, %%zmm0, %%zmm7\n"
            "vpdpbusd %%zmm1, %%zmm0, %%zmm8\n vpdpbusd %%zmm1, %%zmm0, %%zmm9\n vpdpbusd %%zmm1, %%zmm0, %%zmm10\n"
            "vpdpbusd %%zmm1, %%zmm0, %%zmm11\n vpdpbusd %%zmm1, %%zmm0, %%zmm12\n vpdpbusd %%zmm1, %%zmm0, %%zmm13\n"
            "dec %0\n jnz 1b\n"
            : "+r"(n) :: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
              "xmm11", "xmm12", "xmm13", "cc");
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%.6f\n", iters * 12 / best / 1e9);
    return 0;
}
"""


def dot_floor_flags(ap) -> None:
    ap.add_argument("--models", default="lfm2", help="dense shapes: smollm2, qwen3.5, lfm2")
    add_threads(ap, 2)
    ap.add_argument("--rows", default="1,9")


def linear_weights(cfg) -> tuple[int, int]:
    """(weights in the linear layers below the LM head, weights in the LM head) of a target of `cfg`."""
    from blockdraft.models.target import TargetModel
    with torch.device("meta"):
        model = TargetModel(cfg)
    head = model.lm_head.weight.numel()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.lm_head)
    return body, head


def dot_floor(args) -> None:
    """The least time an int4 pass of R rows can take on this machine's AVX512-VNNI path: the VPDPBUSD
    instructions it must issue, at the rate this machine issues them.

    A C loop of 12 independent VPDPBUSD zmm chains runs on `--threads` cores at once (one process each);
    their summed rate is the machine's peak. The kernel issues one VPDPBUSD per row per 64 weights per
    activation byte: 16-bit activations (int4, the default) take two (the hi and the lo byte), 8-bit ones
    (int4-a8) one; the LM head (8-bit weights, the same count per byte) likewise. So a pass of R rows over a
    shape's linear layers issues R x weights / 64 x bytes instructions, and cannot take less than that
    over the peak rate, whatever its epilogue, unpacking or memory traffic cost — compare with the
    "linear layers" part of `bench_costs.py --breakdown` on the same machine. Writes
    benchmarks/results/dot_floor.json."""
    from blockdraft.layers import cpu_kernels as kernels
    from blockdraft.numerics import cpu_model
    if kernels.best_isa() not in ("avx512vnni", "amx"):
        raise SystemExit(f"dot-floor times the AVX512-VNNI path; this CPU's int4 kernel runs {kernels.best_isa()}")
    configs = shaped_configs()
    if bad := [m for m in args.models.split(",") if m not in ("smollm2", "qwen3.5", "lfm2")]:
        raise SystemExit(f"--models {','.join(bad)}: dense shapes only (smollm2, qwen3.5, lfm2)")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "peak"
        (Path(tmp) / "peak.c").write_text(PEAK_SOURCE)
        subprocess.run(["cc", "-O2", str(Path(tmp) / "peak.c"), "-o", str(exe)], check=True)
        procs = [subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True) for _ in range(args.threads)]
        per_core = [float(p.communicate()[0]) for p in procs]
    peak = sum(per_core) * 1e9                         # VPDPBUSD per second, all cores
    rows = [int(r) for r in args.rows.split(",")]
    report = {"cpu": cpu_model(), "isa": kernels.best_isa(), "threads": args.threads,
              "vpdpbusd_per_s_per_core": [x * 1e9 for x in per_core], "models": {}}
    for name in args.models.split(","):
        body, head = linear_weights(configs[name])
        entry = {"linear_weights": body, "lm_head_weights": head}
        for label, nbytes in (("int4", 2), ("int4-a8", 1)):
            entry[label] = {str(r): {"linear layers ms": 1e3 * r * body / 64 * nbytes / peak,
                                     "LM head ms": 1e3 * r * head / 64 * nbytes / peak} for r in rows}
        report["models"][name] = entry
    write_results("dot_floor", report)
    print(json.dumps(report, indent=1))


COMMANDS = {"verify-cost": (verify_cost_flags, verify_cost), "kernel-ab": (kernel_ab_flags, kernel_ab),
            "dot-floor": (dot_floor_flags, dot_floor), "hugepages": (hugepages_flags, hugepages),
            "moe-width": (moe_width_flags, moe_width), "state-rollback": (state_rollback_flags, state_rollback),
            "fidelity": (fidelity_flags, fidelity)}

if __name__ == "__main__":
    sys.exit(run_commands(__doc__, COMMANDS, default=(cost_flags, costs)))
