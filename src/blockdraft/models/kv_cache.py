"""Contiguous per-layer KV cache for the target, with rollback by length.

K/V are written by absolute position and `length` says what is valid, so a
rejected draft is simply overwritten by the next step: rollback is
`truncate(n)`, O(1), no copy. The paged cache of the batch engine implements the
same three methods (`write`, `keys_values`, `truncate`).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", capacity: int = 256):
        self.num_layers = num_layers
        self.shape = (batch, num_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(self.shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(self.shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.length = 0  # tokens whose K/V are committed

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def reserve(self, total: int) -> None:
        """Grow (doubling) so positions [0, total) fit."""
        if total <= self.capacity:
            return
        new_cap = max(total, 2 * self.capacity)
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                grown = old.new_zeros(old.shape[:2] + (new_cap,) + old.shape[3:])
                grown[:, :, : old.shape[2]] = old
                store[i] = grown

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [b, hkv, t, d] at positions start..start+t-1; return all K/V up to there."""
        end = start + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def truncate(self, length: int) -> None:
        """Keep only positions [0, length): the accepted prefix."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"cannot truncate cache to length {length} (capacity {self.capacity})")
        self.length = length
