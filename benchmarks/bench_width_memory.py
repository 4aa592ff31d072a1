"""One request per new engine, as `blockdraft generate` runs: speculative decoding with a width policy
that starts from scratch vs one that starts from this machine's remembered measurements, against
plain decoding of the same numerics, side by side in one run.

    python benchmarks/bench_width_memory.py [--prompts 4] [--tokens 96] [--repeats 2] [--drafter dspark]
        [--quantization int4] [--threads 1]

Every prompt runs through plain decoding (one engine, warm), a fresh speculative engine, and a fresh
speculative engine with `remember_width_costs=True` whose file a first pass over the prompts wrote
(in a temporary BLOCKDRAFT_CACHE). Only `generate` is timed (not loading). Ratios are taken per
prompt and repeat; the report keeps medians. Writes benchmarks/results/width_memory.json and
docs/data/width_memory.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from results_io import new_figure, save_figure, write_results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--drafter", default="dspark")
    ap.add_argument("--quantization", default="int4")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import blockdraft
    from blockdraft.bench.prompt_sets import load_set
    from blockdraft.default_model import smollm2_dir

    model_dir = smollm2_dir()                         # converted once, in the usual cache
    plain = blockdraft.LLM(drafter="none", quantization=args.quantization, max_batch=1)
    params = blockdraft.SamplingParams(max_tokens=args.tokens)
    prompts = [plain.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in load_set("chat", args.prompts)]

    def speculative(remember: bool):
        return blockdraft.LLM(drafter=args.drafter, quantization=args.quantization, max_batch=1,
                              remember_width_costs=remember)

    def rate(llm, prompt) -> float:
        t0 = time.perf_counter()
        n = len(llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].token_ids)
        return n / (time.perf_counter() - t0)

    with tempfile.TemporaryDirectory() as width_cache:
        os.environ["BLOCKDRAFT_CACHE"] = width_cache   # the remembered measurements live here only
        try:
            (Path(width_cache) / model_dir.name).symlink_to(model_dir)   # the converted model, not converted again
            first = speculative(True)
            for p in prompts:                          # a first pass writes the machine's measurements
                first.generate(prompt_token_ids=[p], sampling_params=params)
            del first
            rates: dict[str, list[float]] = {"plain": [], "fresh": [], "remembered": []}
            for rep in range(args.repeats):
                for p in prompts:
                    for mode in rates:
                        llm = plain if mode == "plain" else speculative(mode == "remembered")
                        rates[mode].append(rate(llm, p))
                print(f"repeat {rep}: " + ", ".join(f"{m} {v[-1]:.1f} tok/s" for m, v in rates.items()),
                      file=sys.stderr, flush=True)
        finally:
            os.environ.pop("BLOCKDRAFT_CACHE")
    report = {"drafter": args.drafter, "quantization": args.quantization, "threads": args.threads,
              "prompts": len(prompts), "max_new_tokens": args.tokens, "repeats": args.repeats,
              "tokens_per_s": {m: statistics.median(v) for m, v in rates.items()},
              "vs_plain": {m: statistics.median(x / y for x, y in zip(v, rates["plain"])) for m, v in rates.items()},
              "raw": rates}
    write_results("width_memory", report)
    print(json.dumps({k: v for k, v in report.items() if k != "raw"}, indent=1))
    if made := new_figure(figsize=(6, 3.5)):
        fig, ax = made
        names = list(rates)
        ax.bar(names, [report["vs_plain"][m] for m in names])
        ax.axhline(0.95, ls="--", c="gray", lw=1)
        ax.set_ylabel("tokens/s vs plain decoding")
        ax.set_title(f"one {args.tokens}-token request per new engine ({args.drafter}, {args.quantization})")
        save_figure(fig, "width_memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
