"""Admission: the one place a request's prompt and budget are checked, before any work starts.

Every surface (engine, `generate`, the ONNX backend, the single-sequence oracle) calls these;
each error names the field and the values.
"""

from __future__ import annotations

from ..errors import RequestError
from ..sampling.params import SamplingParams


def check_request(target, prompt_ids: list[int], params: SamplingParams) -> None:
    check_prompt(prompt_ids, params, target.config.vocab_size, target.config.max_position_embeddings)


def check_prompt(prompt_ids: list[int], params: SamplingParams, vocab_size: int, context_length: int) -> None:
    """Refuse an empty prompt, ids outside the vocabulary, or prompt + max_tokens past the context."""
    if not prompt_ids:
        raise RequestError("prompt is empty: at least one token is needed")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"prompt token ids {bad[:5]} outside the vocabulary [0, {vocab_size})")
    if len(prompt_ids) + params.max_tokens > context_length:
        raise RequestError(f"prompt length {len(prompt_ids)} + max_tokens {params.max_tokens} exceeds the "
                           f"context length max_position_embeddings={context_length}")
