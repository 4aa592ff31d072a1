"""Logits → the distribution we sample from: temperature, then top-k, then top-p (nucleus)."""

from __future__ import annotations

import torch

from ..layers.vocab import argmax_ids
from .params import SamplingParams


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[.., vocab] logits -> fp32 probabilities [.., vocab] (greedy callers never get here)."""
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """probs [.., vocab] -> token ids [..]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Argmax (ties → lowest id) at temperature 0, else a sample."""
    if params.greedy:
        return argmax_ids(logits)
    return sample_from(sampling_probs(logits, params), generator)
