"""Paged KV pools and the per-step views the models attend through.

A pool stores K/V per layer as flat slots `[num_blocks * page_size, kv_heads, head_dim]`.
`PagedStep` is the `StepView` of one batched forward over ragged rows: it writes
each real row at its slot and gathers, per sequence, the keys at positions
`0 .. end-1` through the block table, with a causal + length mask. The drafter's
pool mirrors the target's block ids; `context_read` gathers its committed rows.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .views import ContextRead, KernelKV, RowKV, causal_visibility


class PagedKVPool:
    """K/V slots for the model layers listed in `layers` (a drafter's sliding layers live in a ring)."""

    def __init__(self, layers: list[int], num_blocks: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.page_size = page_size
        shape = (num_blocks * page_size, num_kv_heads, head_dim)
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.offsets = torch.arange(page_size, device=device)     # a page's positions, for `prefix_slots`
        self.slot_stride, self.head_stride = num_kv_heads * head_dim, head_dim   # elements, as the kernels step
        self._pointers: tuple | None = None

    def slots(self, tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tables [b, max_blocks], positions [b, t] -> flat slot ids [b, t]."""
        block = torch.gather(tables, 1, positions // self.page_size)
        return block * self.page_size + positions % self.page_size

    def prefix_slots(self, tables: torch.Tensor, length: int) -> torch.Tensor:
        """Flat slot ids of positions 0..length-1 of every row [b * length] (what `read` takes)."""
        b, pages = tables.shape[0], -(-length // self.page_size)
        every = tables[:, :pages, None] * self.page_size + self.offsets             # [b, pages, page_size]
        return every.view(b, -1)[:, :length].reshape(-1)

    def pointers(self) -> tuple:
        """Layer i's K and V buffer addresses, (c_void_p * layers) each (`KernelKV.pointers`): the buffers
        never move, so the arrays are made once."""
        if self._pointers is None:
            self._pointers = tuple((ctypes.c_void_p * len(bufs))(*(bufs[i].data_ptr() for i in range(len(bufs))))
                                   for bufs in (self.k, self.v))
        return self._pointers

    def row_kv(self, row: SlotRow, position: int) -> RowKV:
        """The kernel's view of one decoding row at `position`, its slots kept in `row` (synced past it)."""
        return RowKV(self.pointers(), row.address(position), row.address(0), position + 1, self.slot_stride,
                     self.head_stride)

    def read(self, layer: int, slots: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at `prefix_slots(tables, length)` -> [b, hkv, length, d] each."""
        k, v = self.k[layer].index_select(0, slots), self.v[layer].index_select(0, slots)
        return k.view(b, -1, *k.shape[1:]).transpose(1, 2), v.view(b, -1, *v.shape[1:]).transpose(1, 2)


class SlotRow:
    """One sequence's flat slot ids of positions 0..end-1 in a pool of `page_size` pages, kept from step to step
    so that a decoding step adds its one new position instead of reading the whole block table again: the
    addresses `LayerStack.run_row` takes. A table is only appended to while its sequence runs; one that no
    longer starts with the blocks the row was made from (released, then allocated again) is read anew."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.blocks: list[int] = []                       # the table's first blocks, as the slots were made from
        self.end = 0                                      # positions with their slot written
        self.slots = torch.empty(0, dtype=torch.int64)    # [capacity]
        self._ids = None                                  # ctypes view of `slots`

    def sync(self, table: list[int], end: int) -> None:
        """Slots of positions 0..end-1 from `table` (the sequence's block ids)."""
        n = len(self.blocks)
        if table[:n] != self.blocks:
            self.blocks, self.end, n = [], 0, 0
        if end > self.slots.shape[0]:
            grown = torch.empty(max(end, 2 * self.slots.shape[0], 256), dtype=torch.int64)
            grown[:self.end] = self.slots[:self.end]
            self.slots, self._ids = grown, (ctypes.c_int64 * grown.shape[0]).from_address(grown.data_ptr())
        self.blocks += table[n:-(-end // self.page_size)]
        ids, size = self._ids, self.page_size
        for p in range(self.end, end):
            ids[p] = table[p // size] * size + p % size
        self.end = end

    def address(self, position: int) -> int:
        """Where the slot of `position` (< end) is kept: a one-element array for the kernel's write, and the
        start of the row's keys 0..position for its read."""
        return self.slots.data_ptr() + 8 * position


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
        # from lists, one tensor each: a decoding step makes these for every token
        self.valid = torch.tensor([[i < c for i in range(t)] for c in counts], device=device)        # [b, t]
        self.positions = torch.tensor([[s + i if i < c else 0 for i in range(t)]                     # pads: pos 0
                                       for s, c in zip(starts, counts)], device=device)
        self.end = max(s + c for s, c in zip(starts, counts))
        self.ragged = min(counts) != t
        self.attend = attend
        # every row's one query sees every key 0..end-1 (a batch of decoding rows at one length)
        self.sees_all = t == 1 and min(starts) == max(starts)
        # made once per step, used by every layer: where the real rows go
        slots = self.slots = pool.slots(tables, self.positions)                                # [b, t]
        self.write_slots = slots[self.valid] if self.ragged else slots.view(-1)                # [real rows]

    @functools.cached_property
    def visible(self) -> torch.Tensor | None:
        """[b, 1, t, end]: keys 0..end-1 of every row by position (a row's keys past its own end are masked);
        None where rows attend only to themselves. Made at first use, once per step."""
        if not self.attend:
            return None
        return causal_visibility(self.positions, torch.arange(self.end, device=self.tables.device)[None])

    @functools.cached_property
    def read_slots(self) -> torch.Tensor | None:
        """[b * end]: the slots of keys 0..end-1 of every row (None where rows attend only to themselves)."""
        return self.pool.prefix_slots(self.tables, self.end) if self.attend else None

    def kernel_kv(self) -> KernelKV | None:
        """The pool as the fused CPU layers read it in place (None where a layer lives in a ring, or rows
        attend only to themselves)."""
        if not self.attend or self.ring is not None:
            return None
        pool = self.pool
        write = torch.where(self.valid, self.slots, -1).view(-1) if self.ragged else self.write_slots   # [b * t]
        return KernelKV(pool.k, pool.v, write, self.read_slots.view(self.tables.shape[0], -1), pool.slot_stride,
                        pool.head_stride, None if self.sees_all else self.visible, pool.pointers())

    def kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the real rows of k/v [b, hkv, t, d]; return the K/V attention reads: positions 0..end-1."""
        if layer not in self.pool.k:
            self.ring.write(layer, self.ring_rows, self.positions, self.valid, k, v)
            return k, v
        for pool, new in ((self.pool.k[layer], k), (self.pool.v[layer], v)):
            rows = new.transpose(1, 2)                                                         # [b, t, hkv, d]
            real = rows[self.valid] if self.ragged else rows.reshape(-1, *pool.shape[1:])     # [real rows, hkv, d]
            pool.index_copy_(0, self.write_slots, real)
        if not self.attend:
            return k, v
        return self.pool.read(layer, self.read_slots, self.tables.shape[0])


def context_read(pool: PagedKVPool, tables: torch.Tensor, lengths: list[int], num_layers: int,
                 ring=None, ring_rows: list[int] | None = None) -> ContextRead:
    """The drafter context of each row: committed rows 0..lengths[i]-1 (ragged, masked) for paged
    layers; the ring's recent rows for sliding-window layers."""
    device = tables.device
    b, c = len(lengths), max(lengths)
    positions = torch.arange(c, device=device).expand(b, c)
    valid = positions < torch.tensor(lengths, device=device)[:, None]
    keys, values, pos, val = [], [], [], []
    slots = pool.prefix_slots(tables, c)
    for layer in range(num_layers):
        if layer in pool.k:
            k, v = pool.read(layer, slots, b)
            p, ok = positions, valid
        else:
            k, v, p, ok = ring.read(layer, ring_rows)
        keys.append(k)
        values.append(v)
        pos.append(p)
        val.append(ok)
    return ContextRead(keys, values, pos, val, torch.tensor(lengths, device=device))
