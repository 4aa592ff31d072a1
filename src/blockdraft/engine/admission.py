"""Admission: the one place a request's prompt and budget are checked, before any work starts.

Every surface (engine, `generate`, the ONNX backend, the single-sequence oracle) calls these;
each error names the field and the values.
"""

from __future__ import annotations

from ..errors import RequestError
from ..sampling.params import SamplingParams


def check_request(target, prompt_ids: list[int], params: SamplingParams, max_model_len: int | None = None) -> None:
    """`check_prompt` against the target (and the engine's `max_model_len`, when it is shorter)."""
    limit = target.config.max_position_embeddings
    if max_model_len is not None and max_model_len < limit:
        check_prompt(prompt_ids, params, target.config.vocab_size, max_model_len, "max_model_len")
    else:
        check_prompt(prompt_ids, params, target.config.vocab_size, limit)


def check_prompt(prompt_ids: list[int], params: SamplingParams, vocab_size: int, context_length: int,
                 limit_name: str = "max_position_embeddings") -> None:
    """Refuse an empty prompt, ids outside the vocabulary, or prompt + max_tokens past the context
    (`field`: prompt, or max_tokens when the prompt alone fits)."""
    if not prompt_ids:
        raise RequestError("prompt is empty: at least one token is needed", "prompt")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"prompt token ids {bad[:5]} outside the vocabulary [0, {vocab_size})", "prompt")
    if len(prompt_ids) + params.max_tokens > context_length:
        raise RequestError(f"prompt length {len(prompt_ids)} + max_tokens {params.max_tokens} exceeds the "
                           f"context length {limit_name}={context_length}",
                           "prompt" if len(prompt_ids) >= context_length else "max_tokens")
