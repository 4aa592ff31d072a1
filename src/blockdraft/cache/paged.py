"""Paged KV pools and the per-step views the models attend through.

A pool stores K/V per layer as flat slots `[num_blocks * block_size, kv_heads, head_dim]`.
`PagedStep` is the `StepView` of one batched forward over ragged rows: it writes
each real row at its slot and gathers, per sequence, the keys at positions
`0 .. end-1` through the block table, with a causal + length mask. The drafter's
pool mirrors the target's block ids; `context_read` gathers its committed rows.
"""

from __future__ import annotations

import torch

from ..layers.attention import causal_visibility
from ..models.kv_cache import ContextRead


class PagedKVPool:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.block_size = block_size
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def slots(self, tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tables [b, max_blocks], positions [b, t] -> flat slot ids [b, t]."""
        block = torch.gather(tables, 1, positions // self.block_size)
        return block * self.block_size + positions % self.block_size

    def gather(self, layer: int, tables: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at positions 0..length-1 of every row -> [b, hkv, length, d] each."""
        b = tables.shape[0]
        positions = torch.arange(length, device=tables.device).expand(b, length)
        slots = self.slots(tables, positions)
        return self.k[layer][slots].transpose(1, 2), self.v[layer][slots].transpose(1, 2)


def pad_tables(tables: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    width = max(1, max(len(t) for t in tables))
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)


class PagedStep:
    """New rows of a ragged batch: row i has `counts[i]` tokens starting at position `starts[i]`."""

    def __init__(self, pool: PagedKVPool, tables: torch.Tensor, starts: list[int], counts: list[int],
                 attend: bool = True):
        device = tables.device
        self.pool, self.tables = pool, tables
        t = max(counts)
        offsets = torch.arange(t, device=device)
        self.valid = offsets[None, :] < torch.tensor(counts, device=device)[:, None]          # [b, t]
        starts_t = torch.tensor(starts, device=device)[:, None]
        self.positions = torch.where(self.valid, starts_t + offsets, torch.zeros_like(starts_t))   # pads: pos 0
        self.end = max(s + c for s, c in zip(starts, counts))
        self.slots = pool.slots(tables, self.positions)
        self.visible = None
        if attend:
            b = tables.shape[0]
            k_pos = torch.arange(self.end, device=device).expand(b, self.end)
            self.visible = causal_visibility(self.positions, k_pos)   # pads see only position 0

    def kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the real rows of k/v [b, hkv, t, d]; return gathered K/V for positions 0..end-1."""
        keep = self.valid
        self.pool.k[layer][self.slots[keep]] = k.transpose(1, 2)[keep]
        self.pool.v[layer][self.slots[keep]] = v.transpose(1, 2)[keep]
        if self.visible is None:
            return k, v
        return self.pool.gather(layer, self.tables, self.end)


def context_read(pool: PagedKVPool, tables: torch.Tensor, lengths: list[int]) -> ContextRead:
    """The drafter context of each row: committed rows 0..lengths[i]-1 (ragged, masked)."""
    device = tables.device
    b, c = len(lengths), max(lengths)
    keys, values = zip(*(pool.gather(i, tables, c) for i in range(len(pool.k)))) if c else ([], [])
    positions = torch.arange(c, device=device).expand(b, c)
    valid = positions < torch.tensor(lengths, device=device)[:, None]
    if c == 0:
        keys = [torch.zeros(b, pool.k[i].shape[1], 0, pool.k[i].shape[2], dtype=pool.k[i].dtype, device=device)
                for i in range(len(pool.k))]
        values = keys
    return ContextRead(list(keys), list(values), positions, valid, torch.tensor(lengths, device=device))
