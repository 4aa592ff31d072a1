"""What a verify pass costs on this machine: one target forward over r rows vs one row, SmolLM2-135M.

Speculation pays only if `mean AL > cost(k + 1 rows) / cost(1 row) + cost(draft) / cost(1 row)`.
Ours and transformers side by side, fp32 and bf16, r = 1..9 after a 60-token context; minimum of
5 runs each. Writes benchmarks/results/verify_cost.json.

    python benchmarks/bench_verify_cost.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from blockdraft.default_model import smollm2_dir
from blockdraft.loading import load_target

OUT = Path(__file__).parent / "results"
CONTEXT = list(range(100, 160))


def best_ms(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1000


@torch.inference_mode()
def main() -> None:
    report = {}
    for dtype in ("float32", "bfloat16"):
        ours = load_target(smollm2_dir(), dtype)
        cache = ours.new_cache(1, 256)
        ours(torch.tensor([CONTEXT]), cache)
        hf = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=getattr(torch, dtype)).eval()
        pkv = hf(torch.tensor([CONTEXT]), use_cache=True).past_key_values
        rows = {}
        for r in (1, 2, 3, 5, 9):
            ids = torch.full((1, r), 100)

            def ours_step():
                cache.truncate(len(CONTEXT))
                ours(ids, cache)

            def hf_step():
                extra = pkv.get_seq_length() - len(CONTEXT)
                if extra > 0:
                    pkv.crop(-extra)                    # back to the 60-token context
                hf(ids, past_key_values=pkv, use_cache=True)

            rows[r] = {"ours_ms": best_ms(ours_step), "hf_ms": best_ms(hf_step)}
        for r in rows:
            rows[r]["ours_vs_1_row"] = rows[r]["ours_ms"] / rows[1]["ours_ms"]
            rows[r]["hf_vs_1_row"] = rows[r]["hf_ms"] / rows[1]["hf_ms"]
        report[dtype] = rows
        print(dtype, json.dumps(rows, indent=1))
    OUT.mkdir(exist_ok=True)
    (OUT / "verify_cost.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
