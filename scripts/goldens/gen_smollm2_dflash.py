"""Interop golden: a SmolLM2 DFlash drafter in our published layout run by the reference `dflash` package.

Loads the converted SmolLM2-135M-Instruct (path in argv[1]; regen.sh asks blockdraft for it)
and the shipped DFlash drafter (`src/blockdraft/assets/smollm2/dflash`: the target's full vocabulary,
which the reference can read) with transformers / `DFlashDraftModel.from_pretrained`,
both in fp32, and records `dflash_generate`'s greedy tokens and per-step acceptance lengths
on chat prompts (ids from the HF tokenizer's chat template). Run with the dflash venv's python.
"""

import sys
import time
from pathlib import Path

import dflash.model
import torch
from common import INTEROP_DFLASH, dir_digest, write
from dflash.model import DFlashDraftModel, dflash_generate
from transformers import AutoModelForCausalLM, AutoTokenizer

dflash.model._cuda_time = time.perf_counter  # the reference times with cuda.synchronize; this is a CPU run
PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a string.",
           "Give me three tips for learning to cook.", "What is 12 times 7?"]
MAX_NEW = 48


@torch.inference_mode()
def main() -> None:
    target_dir = Path(sys.argv[1])
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    drafter = DFlashDraftModel.from_pretrained(INTEROP_DFLASH, dtype=torch.float32).eval()
    payload = {"reference": "dflash 0.1.0 / transformers 5.15.0", "max_new_tokens": MAX_NEW, "dtype": "float32",
               "stop_token_ids": [tok.convert_tokens_to_ids("<|im_end|>")],
               "digests": {"target": dir_digest(target_dir), "drafter": dir_digest(INTEROP_DFLASH)}, "cases": []}
    for text in PROMPTS:
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
        prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
        stats = dflash_generate(drafter, target, torch.tensor([prompt]), MAX_NEW, payload["stop_token_ids"],
                                return_stats=True)
        payload["cases"].append({"prompt": prompt, "tokens": stats.output_ids[0, len(prompt):].tolist(),
                                 "acceptance_lengths": [int(a) for a in stats.acceptance_lengths]})
    write("smollm2_dflash.json", payload)


if __name__ == "__main__":
    main()
