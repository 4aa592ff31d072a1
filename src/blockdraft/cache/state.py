"""Per-sequence state of a target's stateful layers, per slot: Qwen3.5's Gated DeltaNet, LFM2's short
conv, and sliding-window attention (gpt-oss).

Every such layer keeps a window of its most recent input rows (`StateLayout.windows`): a conv's last
K-1 inputs, a sliding-window attention layer's last W-1 keys and values (position p's K/V sit at row
W-1-(length-p); what lies before position 0 is masked by position). A DeltaNet keeps a recurrent state
beside its conv rows. None of it can roll back by length as paged KV can. One interface serves every
such layer:

    slot = pool.acquire()                       # zeroed; one per running sequence
    step = pool.begin(slots, counts)            # a forward's view: working copies of the states
    ... target forward: each layer reads `step.initial(layer)`, calls `step.record(...)` ...
    pool.commit(step, slots, keep)              # keep[i] rows of sequence i become its state
    pool.release(slot)

The forward never writes the pool. `commit` makes a slot's state exactly the state after its first
`keep[i]` rows: a window is the last rows up to there (a gather — rows older than the step that are
still inside the window are kept, rejected rows never enter), and the recurrent
state is either the one the forward reached (every row kept) or, after a rejection, a **replay** of
the kept rows' recorded inputs (q, k, v, g, beta) from the slot's state through the same per-token
recurrence — bitwise the state of a run that only saw those rows. `rollback="per_row"` keeps the
state after every row instead and picks one: no replay, but `rows × state` bytes per sequence each
step (`docs/supported-models.md` compares the two; replay is the default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import DeltaNetConfig
from ..layers.deltanet import delta_rule

ROLLBACKS = ("replay", "per_row")


@dataclass(frozen=True)
class StateLayout:
    """What one sequence's state holds: per layer a window of (rows, width) in the model dtype, and for
    the `recurrent` layers a DeltaNet state [H_v, d_k, d_v] in fp32."""

    windows: dict[int, tuple[int, int]]
    recurrent: DeltaNetConfig | None = None
    recurrent_layers: tuple[int, ...] = ()

    @property
    def layers(self) -> list[int]:
        return sorted(self.windows)

    def bytes_per_slot(self, dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        rows = sum(r * w for r, w in self.windows.values()) * size
        r = self.recurrent
        return rows + (len(self.recurrent_layers) * r.num_v_heads * r.k_dim * r.v_dim * 4 if r is not None else 0)


@dataclass
class LayerRecord:
    rows: torch.Tensor                # [b, rows, width] the window's new rows: conv inputs, or K ‖ V (model dtype)
    q: torch.Tensor | None = None        # [b, rows, H, d_k] fp32, normalised and scaled  (DeltaNet only:)
    k: torch.Tensor | None = None        # [b, rows, H, d_k] fp32, normalised
    v: torch.Tensor | None = None        # [b, rows, H, d_v] fp32
    g: torch.Tensor | None = None        # [b, rows, H] fp32 log decay
    beta: torch.Tensor | None = None     # [b, rows, H] fp32
    final: torch.Tensor | None = None    # [b, H, d_k, d_v] after each sequence's last valid row
    per_row: torch.Tensor | None = None  # [b, rows, H, d_k, d_v] (rollback="per_row")


class StateStep:
    """One forward's view of the states of `b` sequences: `counts[i]` new rows each (the rest padding)."""

    def __init__(self, windows: dict[int, torch.Tensor], rec: dict[int, torch.Tensor], counts: list[int],
                 keep_states: bool = False):
        self.windows, self.rec = windows, rec                  # per layer [b, rows, width] / [b, H, d_k, d_v] (DeltaNet)
        self.counts = counts
        self._sliding: dict[int, torch.Tensor] = {}
        rows = max(counts)
        device = next(iter(windows.values())).device
        self.valid = None
        if min(counts) != rows:
            self.valid = torch.arange(rows, device=device)[None, :] < torch.tensor(counts, device=device)[:, None]
        self.keep_states = keep_states
        self.records: dict[int, LayerRecord] = {}

    def initial(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(window rows [b, rows, width], recurrent state [b, H, d_k, d_v] or None) before this forward's rows."""
        return self.windows[layer], self.rec.get(layer)

    def record(self, layer: int, rec: LayerRecord) -> None:
        self.records[layer] = rec

    def sliding_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, window: int):
        """A sliding-window attention layer's new rows k/v [b, hkv, t, d] at `positions` [b, t] -> the keys
        and values they see ([b, hkv, window - 1 + t, d]: the sequence's last window - 1 rows, then the new
        ones) and the mask; the new rows are recorded for the commit (only the kept ones enter the window)."""
        past, _ = self.initial(layer)                                                    # [b, W-1, 2*hkv*d]
        b, hkv, t, d = k.shape
        new = torch.stack([k, v], dim=2).permute(0, 3, 2, 1, 4).reshape(b, t, 2 * hkv * d)   # [b, t, (2, hkv, d)]
        self.record(layer, LayerRecord(new))
        rows = torch.cat([past.to(new.dtype), new], dim=1).view(b, window - 1 + t, 2, hkv, d)
        keys = rows[:, :, 0].transpose(1, 2).contiguous()                                # [b, hkv, W-1+t, d]
        values = rows[:, :, 1].transpose(1, 2).contiguous()
        return keys, values, self.sliding_visible(positions, window)

    def sliding_visible(self, positions: torch.Tensor, window: int) -> torch.Tensor:
        """What each new row of a sliding-window layer sees among [window rows ‖ new rows]:
        positions [b, t] -> [b, 1, t, window - 1 + t], key k visible from query q iff 0 <= q - k < window,
        k >= 0 and k is a real row. One mask per window size and step."""
        if window not in self._sliding:
            start = positions[:, :1]                                                    # [b, 1]: first new row
            past = start - (window - 1) + torch.arange(window - 1, device=positions.device)[None, :]
            keys = torch.cat([past, positions], dim=1)                                  # [b, W-1+t]
            real = torch.cat([past >= 0, self.valid if self.valid is not None
                              else torch.ones_like(positions, dtype=torch.bool)], dim=1)
            diff = positions[:, :, None] - keys[:, None, :]                             # [b, t, W-1+t]
            self._sliding[window] = ((diff >= 0) & (diff < window) & real[:, None, :])[:, None]
        return self._sliding[window]

    def kept_window(self, layer: int, keep: torch.Tensor) -> torch.Tensor:
        """The window after `keep[i]` rows of sequence i: its last rows of (window rows, new rows)."""
        old = self.windows[layer]                                                        # [b, R, width]
        rows = torch.cat([old, self.records[layer].rows.to(old.dtype)], dim=1)           # [b, R + t, width]
        idx = keep[:, None] + torch.arange(old.shape[1], device=keep.device)[None, :]    # [b, R]
        return torch.gather(rows, 1, idx[..., None].expand(-1, -1, old.shape[2]))

    def kept_state(self, layer: int, keep: list[int]) -> torch.Tensor:
        """The recurrent state after `keep[i]` rows of sequence i."""
        r = self.records[layer]
        done = [k == c for k, c in zip(keep, self.counts)]
        if all(done):
            return r.final
        if r.per_row is not None:
            rows = torch.tensor([max(k - 1, 0) for k in keep], device=r.final.device)
            picked = r.per_row[torch.arange(len(keep), device=rows.device), rows]
            zero = torch.tensor([k == 0 for k in keep], device=rows.device)[:, None, None, None]
            return torch.where(zero, self.rec[layer], picked)
        n = max(keep)
        if n == 0:
            return self.rec[layer]
        valid = torch.arange(n, device=r.final.device)[None, :] < torch.tensor(keep, device=r.final.device)[:, None]
        _, replayed, _ = delta_rule(self.rec[layer], r.q[:, :n], r.k[:, :n], r.v[:, :n], r.g[:, :n],
                                    r.beta[:, :n], valid)
        finished = torch.tensor(done, device=r.final.device)[:, None, None, None]
        return torch.where(finished, r.final, replayed)


class StatePool:
    """The states of a target's stateful layers (`layout`) for up to `slots` sequences."""

    def __init__(self, layout: StateLayout, slots: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                 rollback: str = "replay"):
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback={rollback!r} (choose from {ROLLBACKS})")
        self.layout, self.layers, self.rollback = layout, layout.layers, rollback
        self.windows = {i: torch.zeros(slots, rows, width, dtype=dtype, device=device)
                     for i, (rows, width) in layout.windows.items()}
        r = layout.recurrent
        self.rec = {i: torch.zeros(slots, r.num_v_heads, r.k_dim, r.v_dim, dtype=torch.float32, device=device)
                    for i in layout.recurrent_layers}
        self.free_slots = list(range(slots))
        self.num_slots = slots

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    def acquire(self) -> int:
        if not self.free_slots:
            raise RuntimeError("no free state slot (the scheduler admits at most max_batch sequences)")
        slot = self.free_slots.pop(0)
        for store in (self.windows, self.rec):
            for t in store.values():
                t[slot].zero_()
        return slot

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self.free_slots.append(slot)

    def begin(self, slots: list[int], counts: list[int]) -> StateStep:
        idx = torch.tensor(slots, device=next(iter(self.windows.values())).device)
        return StateStep({i: t.index_select(0, idx) for i, t in self.windows.items()},
                         {i: t.index_select(0, idx) for i, t in self.rec.items()}, counts,
                         keep_states=self.rollback == "per_row")

    def commit(self, step: StateStep, slots: list[int], keep: list[int]) -> None:
        """Make slot i's state the state after the first keep[i] rows of the step."""
        device = next(iter(self.windows.values())).device
        idx = torch.tensor(slots, device=device)
        keep_t = torch.tensor(keep, device=device)
        for i in self.layers:
            self.windows[i].index_copy_(0, idx, step.kept_window(i, keep_t))
            if i in self.rec:
                self.rec[i].index_copy_(0, idx, step.kept_state(i, keep))
