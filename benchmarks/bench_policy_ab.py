"""Speculation with the width policy against plain decoding, many short rounds side by side.

    python benchmarks/bench_policy_ab.py [--rounds 16] [--batch 6] [--quantization none|int4]
                                         [--explore-share S] [--min-gap N] [--drafters dspark,dspark-plain,dflash]

Each round runs AR and each of `--drafters` (default DSpark and DFlash; the policy on, its
exploration budget as given, default the shipped one; `NAME-plain` holds that engine at width 0)
over the same chat prompts as one `generate` call each, the order alternating between rounds.
Reports per-round ratios to AR (median, min, max) and the ratio of tokens/s pooled over all
rounds; writes `benchmarks/results/policy_ab.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from results_io import write_results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--batch", type=int, default=6, help="prompts per generate call (the first N chat prompts)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--quantization", default="none")
    ap.add_argument("--explore-share", type=float, help="the policy's exploration budget (default: the shipped)")
    ap.add_argument("--min-gap", type=int, help="the policy's fewest steps between looks (default: the shipped)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--drafters", default="dspark,dflash",
                    help="speculative modes beside AR; NAME-plain: that drafter's engine held at width 0 "
                    "(what a speculative engine costs when it never drafts)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import blockdraft
    from blockdraft.bench.prompt_sets import load_set

    names = ["none"] + args.drafters.split(",")
    modes = {name: blockdraft.LLM(drafter=name.removesuffix("-plain"), max_batch=max(8, args.batch),
                                  quantization=args.quantization) for name in names}
    for name, llm in modes.items():
        if name.endswith("-plain"):
            llm.engine.policy.choose = lambda batch: 0
        if args.explore_share is not None:
            llm.engine.policy.explore_share = args.explore_share
        if args.min_gap is not None:
            llm.engine.policy.min_gap = args.min_gap
    tok = modes["none"].tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": t}]) for t in load_set("chat", args.batch)]
    params = blockdraft.SamplingParams(max_tokens=args.tokens)
    ratios = {m: [] for m in modes}
    pooled = {m: [0.0, 0] for m in modes}              # seconds, tokens
    for r in range(args.rounds):
        rate = {}
        for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            t0 = time.perf_counter()
            outs = modes[m].generate(prompt_token_ids=prompts, sampling_params=params)
            seconds, tokens = time.perf_counter() - t0, sum(len(o.token_ids) for o in outs)
            pooled[m][0] += seconds
            pooled[m][1] += tokens
            rate[m] = tokens / seconds
        for m in modes:
            ratios[m].append(rate[m] / rate["none"])
        print(r, {m: round(v[-1], 3) for m, v in ratios.items()}, file=sys.stderr, flush=True)
    ar_rate = pooled["none"][1] / pooled["none"][0]
    report = {"batch": args.batch, "tokens": args.tokens, "rounds": args.rounds, "quantization": args.quantization,
              "threads": args.threads, "explore_share": modes[names[1]].engine.policy.explore_share,
              "min_gap": modes[names[1]].engine.policy.min_gap,
              "vs_ar": {m: {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v,
                            "pooled": pooled[m][1] / pooled[m][0] / ar_rate} for m, v in ratios.items() if m != "none"}}
    write_results("policy_ab", report)
    print(json.dumps({m: {k: round(v[k], 3) for k in ("median", "min", "max", "pooled")}
                      for m, v in report["vs_ar"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
