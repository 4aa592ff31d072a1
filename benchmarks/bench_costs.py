"""Step cost per row count, per numerics, in one run: what the draft-width policy trades off.

    python benchmarks/bench_costs.py [--context 300] [--repeats 7] [--threads 1] [--models smollm2,qwen3.5,lfm2,lfm2-moe,gpt-oss,gemma4-moe]
        [--isas amx,avx512vnni] [--schemes int8,int4,int4-a8] [--json]

Target: one SmolLM2 pass over R new rows (R = 1, 2, 4, 8, 9, 16) after a `--context`-token
prefill, in bf16 with the row-invariant kernels (what ships), bf16 with plain SDPA/F.linear
(not row-invariant: for comparison), fp32, and weight-only int8 / int4 (bf16 activations).
Drafter: one block pass of each shipped drafter (context already written) in bf16 and in int4 (its
target's numerics: what the default command runs), logits over the first R rows.
Family-shaped targets (`shaped_targets.shaped_configs`: random Qwen3.5, LFM2, LFM2-MoE, gpt-oss and Gemma 4 MoE shapes) in
bf16 and int4: one pass over R rows plus the state commit, once keeping every row and once keeping half of them (a rejection's
rollback: the DeltaNet state replayed over the kept rows, the conv rows and sliding windows gathered). For the
MoE shapes the R rows read up to R x top-k distinct experts: what verifying a block costs there.
`--breakdown` adds, per int4 target, where a 1-row and a 9-row pass spend their time (`step_parts.py`:
linear layers, LM head, attention, DeltaNet recurrence, convolutions, the state commit, the rest) and
one block pass of a 1-layer DSpark drafter (block 8) in the target's numerics.
`--schemes` picks the weight-only series (default int8,int4; int4-a8: int4 with 8-bit activations; the
family shapes take the int4 ones). `--isas` times the int4 and int8 series once per instruction set of the int4 kernel (the first is the
unsuffixed series; the others are suffixed `[isa]`; all give the same bits), so a tile path and the
VNNI path are compared in one run. `--json` prints one JSON object: each series mapping row counts to
median ms, and the instruction set the int4 kernel ran (`isa`).
Medians of `--repeats`; every configuration is timed in the same process, interleaved by repeat.
Writes benchmarks/results/costs.json and docs/data/costs.png (`--models qwen3.5` alone: costs_qwen3_5.*; other
family shapes without smollm2: costs_families.*; `--name NAME`: NAME.*).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.nn import functional as F

from results_io import new_figure, save_figure, write_results
from shaped_targets import hybrid_step, shaped, shaped_configs

ROWS = (1, 2, 4, 8, 9, 16)


BREAKDOWN_ROWS = (1, 9)


def step_breakdown(targets: dict, caches: dict, hybrid: dict, args, g) -> dict:
    """{int4 target: {rows: {part: median ms}}} for `BREAKDOWN_ROWS`-row passes, and the block pass of a
    1-layer DSpark drafter (block 8) built for the target, in its numerics."""
    from step_parts import pass_parts
    from blockdraft.checkpoints.publish import new_drafter
    from blockdraft.layers.quant import quantize_drafter

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
                             getattr(t, "quantization", "none"))
        dc = d.new_cache(1, context + 32)
        prompt = torch.randint(0, t.config.vocab_size, (1, context), generator=g)
        d.extend_context(t(prompt, t.new_cache(1, context + 32), d.config.taps).taps, dc)
        anchor = torch.tensor([int(prompt[0, -1])])
        per["drafter block (1-layer DSpark, block 8)"] = pass_parts(
            lambda: d.logits(d.block_hidden(anchor, 8, dc)), lambda: None, d, args.repeats)
        out[name] = per
    return out


def _isa_of(series: str, isas: list[str]) -> str:
    """The instruction set a series runs on: its `[isa]` suffix, else the first of `isas`."""
    return series[series.rindex("[") + 1:-1] if series.endswith("]") else isas[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--isas", default=None, help="instruction sets for the quantized series, best first "
                    "(default: the best this CPU runs); e.g. amx,avx512vnni")
    ap.add_argument("--name", default=None, help="results name (benchmarks/results/NAME.json, docs/data/NAME.png); "
                    "default by --models: costs, costs_qwen3_5 or costs_families")
    ap.add_argument("--breakdown", action="store_true", help="per-part times of 1- and 9-row int4 passes")
    ap.add_argument("--schemes", default="int8,int4", help="weight-only series: int8, int4, int4-a8")
    ap.add_argument("--json", action="store_true", help="print one JSON object (series -> rows -> ms, isa)")
    ap.add_argument("--models", default="smollm2,qwen3.5", help="smollm2 (every numerics, drafters), and the "
                    "family-shaped random targets: qwen3.5, lfm2, lfm2-moe, gpt-oss, gemma4-moe")
    args = ap.parse_args()
    models = set(args.models.split(","))
    torch.set_num_threads(args.threads)

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

    stable_attn, stable_lin = attention._row_stable, linear.stable_linear
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


if __name__ == "__main__":
    sys.exit(main())
