"""blockdraft as an lm-evaluation-harness model (`lm-eval==0.4.13`, the bench extra).

Importing this package registers the model `blockdraft` in lm-eval's registry, so
`lm_eval.simple_evaluate(model="blockdraft", model_args="target=...,drafter=...")` works;
`python -m blockdraft.lm_eval ...` is lm-eval's own command line with the model registered.
Generation runs through the batch engine with the drafter; log-likelihoods through the target
alone. The model is `model.py`; this file only registers it.
"""

from __future__ import annotations

try:
    from lm_eval.api.registry import register_model
except ImportError as e:                                # pragma: no cover - depends on the environment
    raise ImportError("blockdraft.lm_eval needs lm-eval: pip install 'blockdraft[bench]' (lm-eval==0.4.13)") from e

from .model import BlockdraftLM

register_model("blockdraft")(BlockdraftLM)

__all__ = ["BlockdraftLM"]
