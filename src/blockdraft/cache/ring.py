"""Sliding-window drafter layers: a fixed ring of `window + drafter_block` rows per batch row.

A block at anchor position s only sees context rows with s - k < window, so the
most recent `window - 1` committed rows are all a sliding layer ever needs. Row p
of a sequence lives at ring index p % ring_len of the sequence's ring row; the
positions table says what each slot holds (-1 = empty), and attention masks by it.
"""

from __future__ import annotations

import torch


class DrafterRing:
    def __init__(self, layers: list[int], rows: int, window: int, drafter_block: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.ring_len = window + drafter_block
        shape = (rows, num_kv_heads, self.ring_len, head_dim)
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.pos = {i: torch.full((rows, self.ring_len), -1, dtype=torch.long, device=device) for i in layers}
        self.free_rows = list(range(rows))

    def acquire(self) -> int:
        row = self.free_rows.pop(0)
        for p in self.pos.values():
            p[row] = -1
        return row

    def release(self, row: int | None) -> None:
        if row is not None:
            self.free_rows.append(row)

    def write(self, layer: int, rows: list[int], positions: torch.Tensor, valid: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new rows k/v [b, hkv, t, d] at their positions [b, t] (only the newest ring_len)."""
        newest = positions.masked_fill(~valid, -1).amax(dim=1, keepdim=True)
        keep = valid & (positions > newest - self.ring_len)
        b_idx = torch.tensor(rows, device=k.device)[:, None].expand_as(positions)[keep]
        slot = (positions % self.ring_len)[keep]
        self.k[layer][b_idx, :, slot] = k.transpose(1, 2)[keep]
        self.v[layer][b_idx, :, slot] = v.transpose(1, 2)[keep]
        self.pos[layer][b_idx, slot] = positions[keep]

    def read(self, layer: int, rows: list[int]):
        """-> K, V [b, hkv, ring_len, d], positions [b, ring_len], valid [b, ring_len]."""
        idx = torch.tensor(rows, device=self.pos[layer].device)
        pos = self.pos[layer][idx]
        return self.k[layer][idx], self.v[layer][idx], pos.clamp_min(0), pos >= 0
