"""What a step may read from a cache: visibility by position and the committed-context view.

Bookkeeping only (no model code): the caches in `cache/` and `models/kv_cache.py` build these,
the models' attention consumes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ContextRead:
    """Committed K/V a block attends to (the drafter's context), per drafter layer.

    Layers may hold different rows (a sliding-window layer keeps a ring of recent rows),
    so positions and validity are per layer too.
    """

    keys: list[torch.Tensor]       # per layer [b, hkv, C_l, d]
    values: list[torch.Tensor]     # per layer [b, hkv, C_l, d]
    positions: list[torch.Tensor]  # per layer [b, C_l] absolute positions of the rows
    valid: list[torch.Tensor]      # per layer [b, C_l] False for padding / empty ring slots
    start: torch.Tensor            # [b] position of each row's anchor (= its context length)


@dataclass(frozen=True)
class KernelKV:
    """Where one step's fused CPU layers (`cpu_kernels.LayerStack.run`) write and read K/V in place: layer
    i's buffers k[i], v[i]; new row r (of b*t) goes to slot write_slots[r] (-1: padding, not written) and
    batch row j reads its keys from slots read_slots[j]; a (slot, kv head) row starts at element
    slot * slot_stride + head * head_stride."""

    k: list[torch.Tensor] | dict[int, torch.Tensor]
    v: list[torch.Tensor] | dict[int, torch.Tensor]
    write_slots: torch.Tensor      # [b * t] int64
    read_slots: torch.Tensor       # [b, keys] int64, contiguous
    slot_stride: int
    head_stride: int
    visible: torch.Tensor | None   # [b or 1, 1, t, keys] what each new row sees; None: every key
    pointers: tuple | None = None  # (k, v) buffers' addresses per layer as the kernel takes them, where kept


@dataclass(frozen=True)
class RowKV:
    """Where one decoding row's fused CPU step (`cpu_kernels.LayerStack.run_row`) writes and reads K/V in place,
    as addresses: layer i's buffers at pointers[0][i] (K) and pointers[1][i] (V); the row's new K/V go to the
    slot kept at `write` (one int64), and it reads keys 0..keys-1 from the slots kept at `read` (int64 each).
    The addresses hold while the pool and the slots' `SlotRow` live, until that row's next `sync`."""

    pointers: tuple
    write: int
    read: int
    keys: int
    slot_stride: int
    head_stride: int


def causal_visibility(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None,
                      causal: bool = True) -> torch.Tensor:
    """Visibility by absolute position: q_pos [b, tq], k_pos [b, tk] -> [b, 1, tq, tk].

    causal: k <= q; window: |q - k| < window (one-sided when causal). k_pos may be [1, tk] (every row's).
    """
    if causal and window is None:
        return (q_pos[:, :, None] >= k_pos[:, None, :])[:, None]
    diff = q_pos[:, :, None] - k_pos[:, None, :]
    visible = torch.ones_like(diff, dtype=torch.bool)
    if causal:
        visible = visible & (diff >= 0)
    if window is not None:
        visible = visible & (diff < window)
        if not causal:
            visible = visible & (-diff < window)
    return visible[:, None]
