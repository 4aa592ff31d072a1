"""Batch-engine throughput: AR vs each drafter at batch 1, 2, 4, 8, 16 on the same prompts.

Generated tokens/s (median of repeats) and mean AL per (drafter, batch); spec/AR at
each batch size and batch-N/batch-1. Writes benchmarks/results/engine.json and engine.png.

    python benchmarks/bench_engine.py [--repeats 3] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from blockdraft.engine.engine import EngineConfig, LLMEngine
from blockdraft.llm import TINY_ASSETS as ASSETS
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams

OUT = Path(__file__).parent / "results"
BATCHES = (1, 2, 4, 8, 16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafters", default="none,dflash,dflash2,dspark")
    ap.add_argument("--out", default="engine")
    ap.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True,
                    help="adaptive speculation policy (--no-adaptive: always draft)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 124, (int(n),), generator=g).tolist() for n in torch.randint(8, 40, (16,), generator=g)]
    params = SamplingParams(max_tokens=args.max_new_tokens, ignore_eos=True)
    target = load_target(ASSETS / "target-qwen3")
    results: dict = {}
    for name in args.drafters.split(","):
        drafter = None if name == "none" else load_drafter(ASSETS / name, target)
        results[name] = {}
        for batch in BATCHES:
            rates, als = [], []
            for _ in range(args.repeats):
                cfg = EngineConfig(max_batch=batch, cache_budget_bytes=64 * 2**20, page_size=16,
                                   adaptive_speculation=args.adaptive)
                engine = LLMEngine(target, drafter, cfg)
                t0 = time.perf_counter()
                outs = engine.generate(prompts, params)
                elapsed = time.perf_counter() - t0
                rates.append(sum(len(o.token_ids) for o in outs) / elapsed)
                als.append(engine.stats.spec.mean_acceptance_length)
            results[name][batch] = {"tokens_per_s": statistics.median(rates), "runs_tokens_per_s": rates,
                                    "mean_al": statistics.median(als)}
            print(f"{name:8s} batch {batch:2d}: {statistics.median(rates):8.1f} tok/s  AL {statistics.median(als):.2f}",
                  flush=True)
    ratios = {name: {"spec_over_ar": {b: r[b]["tokens_per_s"] / results["none"][b]["tokens_per_s"] for b in BATCHES}
                     if "none" in results and name != "none" else None,
                     "batch_over_batch1": {b: r[b]["tokens_per_s"] / r[1]["tokens_per_s"] for b in BATCHES}}
              for name, r in results.items()}
    report = {"model": "tiny shipped fixtures (Qwen3, 4 layers, hidden 64, vocab 128), fp32, CPU",
              "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "threads": args.threads, "adaptive_speculation": args.adaptive, "results": results, "ratios": ratios}
    OUT.mkdir(exist_ok=True)
    (OUT / f"{args.out}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, OUT / f"{args.out}.png")
    print(json.dumps(ratios, indent=2))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        ax.plot(BATCHES, [r[b]["tokens_per_s"] for b in BATCHES], marker="o",
                label=f"{name} (AL {r[1]['mean_al']:.2f})" if name != "none" else "AR")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max batch")
    ax.set_ylabel("generated tokens/s")
    ax.set_title("blockdraft engine throughput (tiny fixtures, CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
