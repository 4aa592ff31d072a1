"""Our autoregressive decode vs transformers `generate` on SmolLM2-135M-Instruct (same weights, dtype).

Greedy, 64 new tokens from a chat prompt through blockdraft's engine (`LLMEngine`, no drafter: what
`generate --drafter none` runs), medians of repeats, both in one run.
Writes benchmarks/results/smollm2_ar.json.

    python benchmarks/bench_smollm2_ar.py [--dtype bfloat16|float32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from blockdraft.default_model import smollm2_dir
from blockdraft.engine.engine import sized_engine
from blockdraft.loading import load_target
from blockdraft.sampling.params import SamplingParams
from blockdraft.tokenizer import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="both models' dtype")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated")
    args = ap.parse_args()
    torch.set_num_threads(2)
    path = smollm2_dir()
    dtype = getattr(torch, args.dtype)
    ours, tok = load_target(path, dtype), Tokenizer(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    hf.generation_config.eos_token_id = None
    prompt = tok.encode_chat([{"role": "user", "content": "Write a short story about a robot who learns to paint."}])
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    ids = torch.tensor([prompt])
    times = {"ours": [], "transformers": []}
    for _ in range(args.repeats):
        engine = sized_engine(ours, None, 1, len(prompt) + args.tokens, frozenset())   # fresh: no prefix-cache hit
        t0 = time.perf_counter()
        a = engine.generate([prompt], params)[0].token_ids
        times["ours"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.no_grad():
            b = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.tokens, do_sample=False,
                            pad_token_id=2)[0, len(prompt):].tolist()
        times["transformers"].append(time.perf_counter() - t0)
    report = {"dtype": args.dtype, "tokens": args.tokens, "same_tokens": a == b,
              "tokens_per_s": {k: args.tokens / statistics.median(v) for k, v in times.items()},
              "times_s": times}
    report["ours_over_transformers"] = report["tokens_per_s"]["ours"] / report["tokens_per_s"]["transformers"]
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"smollm2_ar_{args.dtype}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("dtype", "same_tokens", "tokens_per_s", "ours_over_transformers")}))


if __name__ == "__main__":
    main()
