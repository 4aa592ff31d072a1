"""Golden outputs from the reference `dspark-mlx` package (PyPI dspark-mlx 0.1.0, mlx[cpu]).

Runs the DSpark fixture through `generate_eager` (the DeepSpec-matched loop) on the
mlx-lm Qwen3 host, in fp32. dspark-mlx uses the last prompt token as its first
anchor; we run it on `prompt + [first token]` so its steps equal ours one for one
(docs/design.md §1). Records tokens, per-step acceptance lengths and the first block's
Markov-biased logits, drafts and confidences. Run with the dspark venv's python.
"""

from pathlib import Path

import mlx.core as mx
import numpy as np
from common import FIXTURES, fixture_digest, prompts, write
from dspark_mlx import loop as eager_loop
from dspark_mlx.arch.qwen3 import build, qwen3_key_map
from dspark_mlx.hosts.mlx_lm import MlxLmHostAdapter
from dspark_mlx.loading import load_drafter
from mlx_lm.utils import load_config, load_model

MAX_NEW = 40


def fp32(tree):
    return {k: v.astype(mx.float32) for k, v in tree.items()}


def load(name: str):
    model, _ = load_model(Path(FIXTURES / "target-qwen3"))
    model.set_dtype(mx.float32)
    config = load_config(Path(FIXTURES / name))
    drafter = build(config)
    weights = fp32(mx.load(str(FIXTURES / name / "model.safetensors")))
    skipped = load_drafter(drafter, weights, key_map=qwen3_key_map)
    assert not skipped, skipped
    drafter.set_dtype(mx.float32)
    return model, drafter, config


def run(model, drafter, config, prompt: list[int], max_new: int, eos: int | None, threshold: float) -> dict:
    adapter = MlxLmHostAdapter(model, config["target_layer_ids"])
    first = adapter.prefill(mx.array([prompt], dtype=mx.int32))
    t0 = int(np.array(first.logits.astype(mx.float32))[0].argmax())
    adapter.reset()
    steps = []  # n_accepted of each verify step, recorded around the reference's greedy_accept
    original = eager_loop.greedy_accept

    def recording(d, logits):
        res = original(d, logits)
        steps.append(res.n_accepted)
        return res

    eager_loop.greedy_accept = recording
    try:
        events = list(eager_loop.generate_eager(adapter, drafter, prompt + [t0], max_new - 1, eos_id=eos,
                                                confidence_threshold=threshold))
    finally:
        eager_loop.greedy_accept = original
    tokens = [t0] + [e.token for e in events if hasattr(e, "token")]
    # acceptance length of a step = tokens it emitted (the final step keeps what fits)
    lengths, emitted = [], 1
    for m in steps:
        keep = min(m + 1, len(tokens) - emitted)
        if eos is not None and eos in tokens[emitted:emitted + keep]:
            keep = tokens[emitted:emitted + keep].index(eos) + 1
        lengths.append(keep)
        emitted += keep
    return {"prompt": prompt, "tokens": tokens, "acceptance_lengths": lengths}


def first_block(model, drafter, config, prompt: list[int]) -> dict:
    adapter = MlxLmHostAdapter(model, config["target_layer_ids"])
    step = adapter.prefill(mx.array([prompt], dtype=mx.int32))
    anchor = int(np.array(step.logits.astype(mx.float32))[0].argmax())
    drafter.reset()
    drafter.extend_context(step.main_hidden)
    ids, logits, conf = drafter.draft(mx.array([anchor], dtype=mx.int32))
    return {"prompt": prompt, "anchor": anchor, "drafts": np.array(ids)[0, 1:].tolist(),
            "biased_logits": np.array(logits.astype(mx.float32))[0].tolist(),
            "confidence_logits": np.array(conf.astype(mx.float32))[0].tolist()}


def main() -> None:
    mx.set_default_device(mx.cpu)
    model, drafter, config = load("dspark")
    payload = {"reference": "dspark-mlx 0.1.0 generate_eager", "max_new_tokens": MAX_NEW,
               "digests": {"target-qwen3": fixture_digest("target-qwen3"), "dspark": fixture_digest("dspark"),
                           "dspark-last": fixture_digest("dspark-last")},
               "blocks": [first_block(model, drafter, config, prompts()[0])], "cases": []}
    for prompt in prompts():
        payload["cases"].append({"drafter": "dspark", "threshold": 0.0,
                                 **run(model, drafter, config, prompt, MAX_NEW, None, 0.0)})
    for threshold in (0.7, 0.9):
        payload["cases"].append({"drafter": "dspark", "threshold": threshold,
                                 **run(model, drafter, config, prompts()[2], MAX_NEW, None, threshold)})
    ref = payload["cases"][1]["tokens"]
    eos = ref[len(ref) // 2]
    payload["cases"].append({"drafter": "dspark", "threshold": 0.0, "eos": eos,
                             **run(model, drafter, config, prompts()[1], MAX_NEW, eos, 0.0)})
    # a drafter tapping the target's last layer: the host hooks layer outputs (before the final norm)
    model, drafter, config = load("dspark-last")
    payload["blocks"].append({"drafter": "dspark-last", **first_block(model, drafter, config, prompts()[0])})
    for prompt in prompts(9, seed=7):
        payload["cases"].append({"drafter": "dspark-last", "threshold": 0.0,
                                 **run(model, drafter, config, prompt, MAX_NEW, None, 0.0)})
    write("dspark.json", payload)


if __name__ == "__main__":
    main()
