"""Admission: the one place a request's prompt and budget are checked, before any work starts.

Every surface (engine, `generate`, the ONNX backend, the single-sequence oracle) calls it;
each error names the field and the values.
"""

from __future__ import annotations

from ..errors import RequestError
from ..sampling.params import SamplingParams


def check_request(model, prompt_ids: list[int], params: SamplingParams, max_model_len: int | None = None) -> None:
    """Refuse an empty prompt, ids outside the vocabulary, or prompt + max_tokens past the context:
    the target's, or the engine's `max_model_len` when it is shorter (`field`: prompt, or max_tokens
    when the prompt alone fits). `model`: anything with the target's `vocab_size` and
    `max_position_embeddings` (its config, the engine's `ModelSpec`)."""
    vocab_size, context_length = model.vocab_size, model.max_position_embeddings
    limit_name = "max_position_embeddings"
    if max_model_len is not None and max_model_len < context_length:
        context_length, limit_name = max_model_len, "max_model_len"
    if not prompt_ids:
        raise RequestError("prompt is empty: at least one token is needed", "prompt")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"prompt token ids {bad[:5]} outside the vocabulary [0, {vocab_size})", "prompt")
    if len(prompt_ids) + params.max_tokens > context_length:
        raise RequestError(f"prompt length {len(prompt_ids)} + max_tokens {params.max_tokens} exceeds the "
                           f"context length {limit_name}={context_length}",
                           "prompt" if len(prompt_ids) >= context_length else "max_tokens")
