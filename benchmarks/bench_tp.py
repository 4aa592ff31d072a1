"""TP=1 vs TP=N on the default model (SmolLM2-135M, bf16 by default), batch 1, gloo on this CPU.

SmolLM2 has 9 attention heads and 3 KV heads, so N = 3 is the smallest TP size that divides it.

Each configuration runs the same prompts (AR and the shipped DSpark) in its own process group;
tokens/s are medians of repeats, AL from the first repeat. Writes benchmarks/results/tp.json.

    python benchmarks/bench_tp.py [--prompts 4] [--tokens 64] [--repeats 3] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from blockdraft.bench.prompt_sets import load_set
from blockdraft.decode import generate_one
from blockdraft.default_model import smollm2_dir
from blockdraft.llm import DEFAULT_DRAFTERS
from blockdraft.parallel.launch import run_tp
from blockdraft.parallel.tasks import ModelSpec, load_sharded
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.stops import StopCriteria
from blockdraft.tokenizer import Tokenizer

OUT = Path(__file__).parent / "results"


def timed_task(tp, payload):
    spec, prompts, params, repeats, eos = payload
    target, drafter = load_sharded(spec, tp)
    stop = StopCriteria(eos_ids=eos)
    tps, lengths = [], []
    for rep in range(repeats):
        tokens, seconds = 0, 0.0
        for p in prompts:
            t0 = time.perf_counter()
            g = generate_one(target, p, params, drafter, stop)
            seconds += time.perf_counter() - t0
            tokens += len(g.token_ids)
            if rep == 0:
                lengths += g.acceptance_lengths
        tps.append(tokens / seconds)
    return {"tokens_per_s": statistics.median(tps), "repeats": tps,
            "mean_al": sum(lengths) / len(lengths) if lengths else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tp", type=int, default=3, help="SmolLM2 has 9 heads and 3 KV heads: TP 3 divides them")
    args = ap.parse_args()
    target_dir = smollm2_dir()
    tok = Tokenizer(target_dir)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in load_set("chat", args.prompts)]
    params = SamplingParams(max_tokens=args.tokens)
    eos = frozenset({tok.eos_token_id})
    report = {"dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.tokens, "results": {}}
    for name, drafter in (("ar", None), ("dspark", DEFAULT_DRAFTERS["dspark"])):
        for tp in (1, args.tp):
            spec = ModelSpec(target_dir, drafter, args.dtype)
            report["results"][f"{name}_tp{tp}"] = run_tp(tp, timed_task, (spec, prompts, params, args.repeats, eos))
            print(name, tp, report["results"][f"{name}_tp{tp}"])
    OUT.mkdir(exist_ok=True)
    (OUT / "tp.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
