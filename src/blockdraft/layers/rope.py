"""Rotary position embeddings (NeoX half-split layout), with the scalings HF configs use.

Supported `rope_type`s: `default`, `linear`, `llama3`, `yarn`, `proportional` (Gemma 4). The inverse
frequencies follow transformers' `modeling_rope_utils` so that logits match it;
cos/sin are computed in fp32 at absolute positions and cast to the activation dtype.
"""

from __future__ import annotations

import math

import torch

from ..config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Returns (inv_freq [head_dim/2] fp32, attention scaling applied to cos/sin)."""
    dim = head_dim
    base = rope.theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, dim)
    if rope.rope_type == "proportional":       # Gemma 4: only the first factor of each half rotates
        rotated = int(rope.partial_rotary_factor * dim // 2)
        inv_freq[rotated:] = 0.0               # cos 1, sin 0: those dims pass through unchanged
        return inv_freq / rope.factor, 1.0
    raise AssertionError(rope.rope_type)  # RopeConfig validates the type


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


TABLE_ELEMENTS = 16384   # elements of one cos/sin call while a table grows: below PyTorch's grain size (32768), so
                         # the call runs on one thread, and its vectorized loop covers every element where the
                         # head dim is a multiple of 32 (a split or a scalar tail would round otherwise)


class Rotary:
    """cos/sin tables at absolute positions; not an nn.Module (no state to load)."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        self.inv_freq, self.scaling = inverse_frequencies(rope, head_dim)
        self.head_dim = head_dim
        half = head_dim // 2
        self.sign = torch.tensor([-1.0] * half + [1.0] * (head_dim - half), device="cpu")   # negates sin's first half
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None

    def table(self, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos, sin [>= end, head_dim] in `dtype` on the CPU, row p the bits `cos_sin` gives position p (made in
        calls of `TABLE_ELEMENTS`, kept and grown as positions come); None where the head dim is not a multiple
        of 32 (there the bits of a longer call could differ from a one-row call's)."""
        if self.head_dim % 32 or self.inv_freq.device.type != "cpu":
            return None
        if self._table is None or self._table[0].dtype != dtype:
            self._table = (torch.empty(0, self.head_dim, dtype=dtype), torch.empty(0, self.head_dim, dtype=dtype))
        have, chunk = self._table[0].shape[0], TABLE_ELEMENTS // self.head_dim
        if end > have:                                          # doubled, so that growing costs O(end) in all
            parts = [self.cos_sin(torch.arange(a, a + chunk)[None], dtype)
                     for a in range(have, max(end, 2 * have), chunk)]
            self._table = tuple(torch.cat([old] + [p[i][0, 0] for p in parts]) for i, old in enumerate(self._table))
        return self._table

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [batch, seq] -> cos, sin [batch, 1, seq, head_dim] (broadcast over heads), sin's
        first half negated: what `apply_rope` takes."""
        if self.inv_freq.device != positions.device:
            self.inv_freq, self.sign = self.inv_freq.to(positions.device), self.sign.to(positions.device)
        freqs = positions.float()[..., None] * self.inv_freq                     # [batch, seq, head_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)                                   # [batch, seq, head_dim]
        cos, sin = emb.cos(), emb.sin()
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos.to(dtype)[:, None], (sin * self.sign).to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, head_dim]; cos/sin from `Rotary.cos_sin`. NeoX rotation
    x·cos + [-x2, x1]·sin, computed as x·cos + [x2, x1]·[-sin1, sin2] (the same bits, fewer ops)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin
