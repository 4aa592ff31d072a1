"""Paged KV pools and the per-step views the models attend through.

A pool stores K/V per layer as flat slots `[num_blocks * page_size, kv_heads, head_dim]`.
`PagedStep` is the `StepView` of one batched forward over ragged rows: it writes
each real row at its slot and gathers, per sequence, the keys at positions
`0 .. end-1` through the block table, with a causal + length mask. The drafter's
pool mirrors the target's block ids; `context_read` gathers its committed rows.
"""

from __future__ import annotations

import torch

from .views import ContextRead, causal_visibility


class PagedKVPool:
    """K/V slots for the model layers listed in `layers` (a drafter's sliding layers live in a ring)."""

    def __init__(self, layers: list[int], num_blocks: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.page_size = page_size
        shape = (num_blocks * page_size, num_kv_heads, head_dim)
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}

    def slots(self, tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tables [b, max_blocks], positions [b, t] -> flat slot ids [b, t]."""
        block = torch.gather(tables, 1, positions // self.page_size)
        return block * self.page_size + positions % self.page_size

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
    """New rows of a ragged batch: row i has `counts[i]` tokens starting at position `starts[i]`.

    Layers the pool does not hold go to `ring` (a drafter's sliding-window layers), if given.
    """

    def __init__(self, pool: PagedKVPool, tables: torch.Tensor, starts: list[int], counts: list[int],
                 attend: bool = True, ring=None, ring_rows: list[int] | None = None):
        device = tables.device
        self.pool, self.tables = pool, tables
        self.ring, self.ring_rows = ring, ring_rows
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
        if layer not in self.pool.k:
            self.ring.write(layer, self.ring_rows, self.positions, keep, k, v)
            return k, v
        self.pool.k[layer][self.slots[keep]] = k.transpose(1, 2)[keep]
        self.pool.v[layer][self.slots[keep]] = v.transpose(1, 2)[keep]
        if self.visible is None:
            return k, v
        return self.pool.gather(layer, self.tables, self.end)


def context_read(pool: PagedKVPool, tables: torch.Tensor, lengths: list[int], num_layers: int,
                 ring=None, ring_rows: list[int] | None = None) -> ContextRead:
    """The drafter context of each row: committed rows 0..lengths[i]-1 (ragged, masked) for paged
    layers; the ring's recent rows for sliding-window layers."""
    device = tables.device
    b, c = len(lengths), max(lengths)
    positions = torch.arange(c, device=device).expand(b, c)
    valid = positions < torch.tensor(lengths, device=device)[:, None]
    keys, values, pos, val = [], [], [], []
    for layer in range(num_layers):
        if layer in pool.k:
            k, v = pool.gather(layer, tables, c)
            p, ok = positions, valid
        else:
            k, v, p, ok = ring.read(layer, ring_rows)
        keys.append(k)
        values.append(v)
        pos.append(p)
        val.append(ok)
    return ContextRead(keys, values, pos, val, torch.tensor(lengths, device=device))
