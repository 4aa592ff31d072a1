"""TP=1 vs TP=N on the default model (SmolLM2-135M, bf16 by default), batch 1, gloo on this CPU.

SmolLM2 has 9 attention heads and 3 KV heads, so N = 3 is the smallest TP size that divides it.

Each configuration runs the same prompts (AR and the shipped DSpark) through the engine at
batch 1 in its own process group (rank 0 schedules, the others follow: what `generate --tp`
and `serve --tp` run); tokens/s are medians of repeats, AL from the first repeat. Writes
benchmarks/results/tp.json.

    python benchmarks/bench_tp.py [--prompts 4] [--tokens 64] [--repeats 3] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from blockdraft.bench.prompt_sets import load_set
from blockdraft.default_model import smollm2_dir
from blockdraft.llm import DEFAULT_DRAFTERS, LLM
from blockdraft.parallel.launch import run_tp
from blockdraft.parallel.mirror import follow
from blockdraft.sampling.params import SamplingParams
from blockdraft.tokenizer import Tokenizer

OUT = Path(__file__).parent / "results"


def timed_task(tp, payload):
    kwargs, prompts, params, repeats = payload
    llm = LLM(**kwargs, tp=tp if tp.world > 1 else None)
    if tp.rank != 0:
        follow(llm.engine)
        return None
    tps, lengths = [], []
    for rep in range(repeats):
        tokens, seconds = 0, 0.0
        for p in prompts:
            t0 = time.perf_counter()
            g = llm.generate(prompt_token_ids=[p], sampling_params=params)[0]
            seconds += time.perf_counter() - t0
            tokens += len(g.token_ids)
            if rep == 0:
                lengths += g.acceptance_lengths
        tps.append(tokens / seconds)
    if tp.world > 1:
        llm.engine.shutdown()
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
    report = {"dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.tokens, "results": {}}
    for name, drafter in (("ar", None), ("dspark", DEFAULT_DRAFTERS["dspark"])):
        for tp in (1, args.tp):
            kwargs = dict(target=target_dir, drafter=drafter or "none", dtype=args.dtype, max_batch=1,
                          adaptive_speculation=False, quantization="none")
            report["results"][f"{name}_tp{tp}"] = run_tp(tp, timed_task, (kwargs, prompts, params, args.repeats))
            print(name, tp, report["results"][f"{name}_tp{tp}"])
    OUT.mkdir(exist_ok=True)
    (OUT / "tp.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
