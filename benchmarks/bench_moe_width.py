"""What speculation buys on MoE targets, and which draft width the policy picks there.

    python benchmarks/bench_moe_width.py [--families lfm2,lfm2-moe,gpt-oss,gemma4-moe] [--repeats 5]
                                         [--context 300] [--threads 1] [--numerics int4,bf16]

A verify pass of R rows on a MoE target reads the union of its rows' experts — up to R × top-k of them
where one row reads top-k — so its cost grows with R faster than a dense target's. For each family-shaped
random target (`shaped_targets.shaped_configs`) this measures, in one process and interleaved by repeat:
the target's pass over R = 1..9 rows after a `--context`-token prefill, state commit included (median of
`--repeats`), and one block pass of a 1-layer DSpark drafter of the target's width (`new_drafter`, block
8) in the target's numerics. Those costs go into the engine's own `DraftWidthPolicy` — cost(width w) =
drafter + target(w + 1 rows), cost(0) = target(1 row) — with acceptance counts for a per-slot
acceptance rate a (slot i accepted with probability a^i); the policy's chosen width and its expected
speed against plain decoding, E(w)/cost(w) ÷ 1/cost(0), are reported per a. `bench_spec.py` runs
the engine end to end instead. Random weights: real routers spread tokens over experts
differently, so a real checkpoint's expert reads, and so its costs, can differ.
Writes benchmarks/results/moe_width.json and docs/data/moe_width.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from results_io import new_figure, save_figure, write_results
from shaped_targets import hybrid_step, shaped, shaped_configs

RATES = (0.5, 0.7, 0.85, 0.95)
MAX_WIDTH = 8


def drafter_cost(target, repeats: int, context: int) -> float:
    from blockdraft.checkpoints.publish import new_drafter
    from blockdraft.layers.quant import quantize_drafter
    n = target.config.num_layers
    drafter = new_drafter(target, "dspark", 1, MAX_WIDTH, (1, n // 2, n - 2), mask_token_id=0, markov_rank=64)
    quantize_drafter(drafter, getattr(target, "quantization", "none"))     # the target's numerics, as load_drafter
    cache = drafter.new_cache(1, context + 32)
    taps = torch.randn(1, context, 3 * target.config.hidden_size).to(target.dtype)
    drafter.extend_context(taps, cache)
    drafter.logits(drafter.block_hidden(torch.tensor([1]), MAX_WIDTH, cache))       # warm-up: kernel plans
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        drafter.logits(drafter.block_hidden(torch.tensor([1]), MAX_WIDTH, cache))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="lfm2,lfm2-moe,gpt-oss,gemma4-moe")
    ap.add_argument("--numerics", default="int4,bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from blockdraft.layers.quant import quantize_target
    from blockdraft.layers import cpu_kernels as kernels
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
