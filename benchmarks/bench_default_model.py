"""Default model, side by side in one run: our AR and speculative engine vs HF transformers vs
ONNX Runtime GenAI 0.18.0's own CPU builds of the same weights (fp32 and int4), batch 1 and 8.

    python benchmarks/bench_default_model.py [--prompts 8] [--tokens 64] [--repeats 2] [--batches 1,8]
        [--threads 1]

Every repeat runs every mode over the same chat prompts (bench chat set), greedy, one batch of
prompts at a time through every mode before the next (so the modes compared ran close in time:
a shared machine's speed drifts by tens of percent over minutes); tokens/s =
generated tokens / wall time (prefill included, and tokens after EOS not counted). Ratios are
taken within a repeat; the report keeps medians. ORT-GenAI models are built once with
`python -m onnxruntime_genai.models.builder -i <converted SmolLM2> -o OUT -p fp32|int4 -e cpu`
and run in this process through og.Generator (the onnx extra; skipped when it is missing) with
`--threads` intra-op threads like ours, and the int4 build once more at onnxruntime's own default
(one thread per core: `ortgenai_int4_own_threads`).
Writes benchmarks/results/default_model.json and docs/data/default_model.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from results_io import new_figure, save_figure, write_results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-ortgenai", action="store_true")
    ap.add_argument("--quantizations", default="none,int4", help="our numerics: none (bf16) and weight-only schemes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import blockdraft
    from blockdraft.bench.ortgenai import until_eos
    from blockdraft.bench.prompt_sets import load_set
    from blockdraft.bench.run import HFBaseline
    from blockdraft.default_model import cache_root, smollm2_dir
    from blockdraft.numerics import cpu_model

    batches = [int(b) for b in args.batches.split(",")]
    texts = load_set("chat", args.prompts)
    base = blockdraft.LLM(drafter="none", max_batch=max(batches), quantization="none")
    tok = base.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": t}]) for t in texts]
    rendered = [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
    eos = set(base._eos_ids())
    params = blockdraft.SamplingParams(max_tokens=args.tokens)
    ours, ar_of = {}, {}          # mode -> LLM; mode -> the AR mode of the same numerics
    for quant in args.quantizations.split(","):
        suffix = "" if quant == "none" else f"_{quant}"
        ours[f"ar{suffix}"] = base if quant == "none" else blockdraft.LLM(drafter="none", max_batch=max(batches),
                                                                           quantization=quant)
        for name in ("dspark", "dflash"):
            ours[f"{name}{suffix}"] = blockdraft.LLM(drafter=name, max_batch=max(batches), quantization=quant)
        ours[f"dspark_fixed{suffix}"] = blockdraft.LLM(drafter="dspark", max_batch=max(batches), quantization=quant,
                                                       adaptive_speculation=False)
        for mode in [m for m in ours if m.endswith(suffix) or not suffix]:
            ar_of.setdefault(mode, f"ar{suffix}")
    hf = None if args.no_hf else HFBaseline(smollm2_dir(), torch.bfloat16, sorted(eos))

    ort = {}
    try:
        import onnxruntime_genai  # noqa: F401  (the baseline needs it; skip cleanly without)

        from blockdraft.bench import ortgenai
    except ImportError:
        print("no onnxruntime-genai (the onnx extra): skipping that baseline", file=sys.stderr)
    else:
        if not args.no_ortgenai:
            for precision in ("int4", "fp32"):      # at our thread count; int4 also at onnxruntime's default
                built = ortgenai.build(smollm2_dir(), precision, cache_root())
                if built is not None:
                    ort[f"ortgenai_{precision}"] = (built, args.threads)
                    if precision == "int4":
                        ort["ortgenai_int4_own_threads"] = (built, None)

    def run_ort(model: tuple[Path, int | None], texts: list[str]) -> tuple[float, list[list[int]]]:
        seconds, outs = ortgenai.generator_generate(model[0], texts, len(texts), args.tokens, threads=model[1])
        return seconds, [until_eos(t, eos) for t in outs]

    def run(mode: str, lo: int, hi: int) -> tuple[float, list[list[int]]]:
        """One mode over prompts lo..hi-1 as one batch -> (seconds, generated ids)."""
        if mode not in ours and mode != "hf":
            return run_ort(ort[mode], rendered[lo:hi])
        t0 = time.perf_counter()
        if mode == "hf":
            outs = [until_eos(hf.generate(p, params), eos) for p in prompts[lo:hi]]
        else:
            outs = [o.token_ids for o in ours[mode].generate(prompt_token_ids=prompts[lo:hi], sampling_params=params)]
        return time.perf_counter() - t0, outs

    modes = [*ours, *([] if hf is None else ["hf"]), *ort]
    first_ar = next(m for m in ours if m.startswith("ar"))      # bf16 AR where it runs: HF's and ORT's reference
    raw: dict = {}
    for batch in batches:
        rate = {m: [] for m in modes if m != "hf" or batch == 1}
        same_as_ar = {m: 0 for m in rate}
        for rep in range(args.repeats):
            seconds, outs = {m: 0.0 for m in rate}, {m: [] for m in rate}
            order = list(rate) if rep % 2 == 0 else list(rate)[::-1]   # no mode always runs after the same one
            for lo in range(0, len(prompts), batch):      # every mode on one batch, then the next batch:
                for mode in order:                        # modes compared close in time (machine speed drifts)
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
                          "vs_our_ar": statistics.median(x / y for x, y in zip(v, rate[first_ar])),
                          "vs_our_ar_same_numerics": statistics.median(
                              x / y for x, y in zip(v, rate[ar_of.get(m, first_ar)])),
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
