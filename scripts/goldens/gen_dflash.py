"""Golden outputs from the reference `dflash` package (PyPI dflash 0.1.0, transformers 5.15.0).

Runs the fixtures through `dflash_generate` (greedy): tokens and per-step acceptance
lengths for several block sizes, plus the first block's draft logits/tokens.
Run with the dflash venv's python (see scripts/goldens/regen.sh).
"""

import torch
from common import FIXTURES, fixture_digest, prompts, write
from dflash.model import DFlash2DraftModel, DFlashDraftModel, _output_head, dflash_generate, extract_context_feature
from transformers import AutoModelForCausalLM

import time

import dflash.model

dflash.model._cuda_time = time.perf_counter  # the reference times with cuda.synchronize; this is a CPU run
torch.set_num_threads(1)
MAX_NEW = 40
CASES = {"dflash": [6, 4, 8], "dflash-sliding": [6, 3], "dflash2": [6, 4], "dflash-last": [6]}  # -last taps the last layer


def first_block(model, target, prompt: list[int]) -> dict:
    """Drafts of the first step: context = prompt taps, anchor = the first generated token."""
    ids = torch.tensor([prompt])
    out = target(ids, output_hidden_states=True)
    anchor = int(out.logits[0, -1].argmax())
    taps = extract_context_feature(out.hidden_states, model.target_layer_ids)
    bs = model.block_size
    block = torch.full((1, bs), model.mask_token_id)
    block[0, 0] = anchor
    noise = torch.nn.functional.embedding(block, target.get_input_embeddings().weight)
    pos = torch.arange(len(prompt) + bs)[None]
    hidden = model(target_hidden=taps, noise_embedding=noise, position_ids=pos)[:, 1:]
    logits = model.compute_logits(hidden, _output_head(target))
    if isinstance(model, DFlash2DraftModel):
        drafts = model.propose(hidden, block[:, 0], _output_head(target), 0.0)[0]
    else:
        drafts = logits.argmax(-1)
    return {"prompt": prompt, "anchor": anchor, "draft_logits": logits[0].tolist(), "drafts": drafts[0].tolist()}


@torch.inference_mode()
def main() -> None:
    target = AutoModelForCausalLM.from_pretrained(FIXTURES / "target-qwen3", dtype=torch.float32).eval()
    payload = {"reference": "dflash 0.1.0 / transformers 5.15.0", "max_new_tokens": MAX_NEW,
               "digests": {"target-qwen3": fixture_digest("target-qwen3")}, "cases": [], "blocks": []}
    for name, block_sizes in CASES.items():
        cls = DFlash2DraftModel if name == "dflash2" else DFlashDraftModel
        model = cls.from_pretrained(FIXTURES / name, dtype=torch.float32).eval()
        payload["digests"][name] = fixture_digest(name)
        payload["blocks"].append({"drafter": name, **first_block(model, target, prompts()[0])})
        for bs in block_sizes:
            for prompt in prompts():
                stats = dflash_generate(model, target, torch.tensor([prompt]), MAX_NEW, None, block_size=bs,
                                        return_stats=True)
                payload["cases"].append({"drafter": name, "block_size": bs, "prompt": prompt,
                                         "tokens": stats.output_ids[0, len(prompt):].tolist(),
                                         "acceptance_lengths": [int(a) for a in stats.acceptance_lengths]})
        # one run with a stop token inside an accepted run
        prompt = prompts()[1]
        ref = next(c for c in payload["cases"] if c["drafter"] == name and c["prompt"] == prompt)
        stop_id = ref["tokens"][len(ref["tokens"]) // 2]
        stats = dflash_generate(model, target, torch.tensor([prompt]), MAX_NEW, [stop_id], return_stats=True)
        payload["cases"].append({"drafter": name, "block_size": model.block_size, "prompt": prompt,
                                 "stop_token_ids": [stop_id], "tokens": stats.output_ids[0, len(prompt):].tolist(),
                                 "acceptance_lengths": [int(a) for a in stats.acceptance_lengths]})
    write("dflash.json", payload)


if __name__ == "__main__":
    main()
