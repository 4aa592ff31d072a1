"""Times the reference `dflash_generate` loop (run with the dflash reference venv's python).

Reads a JSON job on stdin: {"assets", "drafters", "prompts", "max_new_tokens", "repeats", "threads"};
prints {"<drafter>": {"times_s": [...], "acceptance_lengths": [[...], ...]}}.
"""

import json
import sys
import time

import dflash.model
import torch
from dflash.model import DFlash2DraftModel, DFlashDraftModel, dflash_generate
from transformers import AutoModelForCausalLM

dflash.model._cuda_time = time.perf_counter  # the reference synchronises CUDA for its own timing


def main() -> None:
    job = json.load(sys.stdin)
    torch.set_num_threads(job["threads"])
    target = AutoModelForCausalLM.from_pretrained(f"{job['assets']}/target-qwen3", dtype=torch.float32).eval()
    result = {}
    for name in job["drafters"]:
        cls = DFlash2DraftModel if name == "dflash2" else DFlashDraftModel
        model = cls.from_pretrained(f"{job['assets']}/{name}", dtype=torch.float32).eval()
        times, lengths = [], []
        for _ in range(job["repeats"]):
            t0 = time.perf_counter()
            lengths = [dflash_generate(model, target, torch.tensor([p]), job["max_new_tokens"], None,
                                       return_stats=True).acceptance_lengths for p in job["prompts"]]
            times.append(time.perf_counter() - t0)
        result[name] = {"times_s": times, "acceptance_lengths": [[int(a) for a in al] for al in lengths]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
