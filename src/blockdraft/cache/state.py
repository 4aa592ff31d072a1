"""Per-sequence state of a target's stateful layers (Qwen3.5 Gated DeltaNet, LFM2 short conv), per slot.

A stateful layer cannot roll back by length as KV can. One interface serves every such layer:

    slot = pool.acquire()                       # zeroed; one per running sequence
    step = pool.begin(slots, counts)            # a forward's view: working copies of the states
    ... target forward: each layer reads `step.initial(layer)`, calls `step.record(...)` ...
    pool.commit(step, slots, keep)              # keep[i] rows of sequence i become its state
    pool.release(slot)

The forward never writes the pool. `commit` makes a slot's state exactly the state after its first
`keep[i]` rows: the conv state is the last K-1 input rows up to there (a gather), and the recurrent
state is either the one the forward reached (every row kept) or, after a rejection, a **replay** of
the kept rows' recorded inputs (q, k, v, g, beta) from the slot's state through the same per-token
recurrence — bitwise the state of a run that only saw those rows. `rollback="per_row"` keeps the
state after every row instead and picks one: no replay, but `rows × state` bytes per sequence each
step (`docs/supported-models.md` compares the two; replay is the default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import DeltaNetConfig, ShortConvConfig
from ..layers.deltanet import delta_rule

ROLLBACKS = ("replay", "per_row")


def _recurrent(cfg) -> bool:
    return isinstance(cfg, DeltaNetConfig)


def state_bytes_per_slot(cfg: DeltaNetConfig | ShortConvConfig, num_layers: int, dtype: torch.dtype) -> int:
    """Bytes one sequence's state takes: conv rows in the model dtype, a DeltaNet's recurrent state in fp32."""
    conv = (cfg.conv_kernel - 1) * cfg.conv_dim * torch.empty((), dtype=dtype).element_size()
    rec = cfg.num_v_heads * cfg.k_dim * cfg.v_dim * 4 if _recurrent(cfg) else 0
    return num_layers * (conv + rec)


@dataclass
class LayerRecord:
    conv_in: torch.Tensor                # [b, rows, conv_dim] the conv's inputs (model dtype)
    q: torch.Tensor | None = None        # [b, rows, H, d_k] fp32, normalised and scaled  (DeltaNet only:)
    k: torch.Tensor | None = None        # [b, rows, H, d_k] fp32, normalised
    v: torch.Tensor | None = None        # [b, rows, H, d_v] fp32
    g: torch.Tensor | None = None        # [b, rows, H] fp32 log decay
    beta: torch.Tensor | None = None     # [b, rows, H] fp32
    final: torch.Tensor | None = None    # [b, H, d_k, d_v] after each sequence's last valid row
    per_row: torch.Tensor | None = None  # [b, rows, H, d_k, d_v] (rollback="per_row")


class StateStep:
    """One forward's view of the states of `b` sequences: `counts[i]` new rows each (the rest padding)."""

    def __init__(self, conv: dict[int, torch.Tensor], rec: dict[int, torch.Tensor], counts: list[int],
                 keep_states: bool = False):
        self.conv, self.rec = conv, rec                  # per layer [b, K-1, C] / [b, H, d_k, d_v] (DeltaNet)
        self.counts = counts
        rows = max(counts)
        device = next(iter(conv.values())).device
        self.valid = None
        if min(counts) != rows:
            self.valid = torch.arange(rows, device=device)[None, :] < torch.tensor(counts, device=device)[:, None]
        self.keep_states = keep_states
        self.records: dict[int, LayerRecord] = {}

    def initial(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(conv rows [b, K-1, C], recurrent state [b, H, d_k, d_v] or None) before this forward's rows."""
        return self.conv[layer], self.rec.get(layer)

    def record(self, layer: int, rec: LayerRecord) -> None:
        self.records[layer] = rec

    def kept_conv(self, layer: int, keep: torch.Tensor) -> torch.Tensor:
        """The conv state after `keep[i]` rows of sequence i: the last K-1 of (state rows, inputs)."""
        conv = self.conv[layer]
        window = torch.cat([conv, self.records[layer].conv_in.to(conv.dtype)], dim=1)   # [b, K-1+rows, C]
        idx = keep[:, None] + torch.arange(conv.shape[1], device=keep.device)[None, :]  # [b, K-1]
        return torch.gather(window, 1, idx[..., None].expand(-1, -1, conv.shape[2]))

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


class RecurrentStatePool:
    """States of the target layers `layers` for up to `slots` sequences."""

    def __init__(self, layers: list[int], slots: int, cfg: DeltaNetConfig | ShortConvConfig, dtype: torch.dtype,
                 device: torch.device | str = "cpu", rollback: str = "replay"):
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback={rollback!r} (choose from {ROLLBACKS})")
        self.layers, self.rollback = list(layers), rollback
        self.conv = {i: torch.zeros(slots, cfg.conv_kernel - 1, cfg.conv_dim, dtype=dtype, device=device)
                     for i in layers}
        self.rec = {i: torch.zeros(slots, cfg.num_v_heads, cfg.k_dim, cfg.v_dim, dtype=torch.float32, device=device)
                    for i in layers} if _recurrent(cfg) else {}
        self.free_slots = list(range(slots))
        self.num_slots = slots

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    def acquire(self) -> int:
        if not self.free_slots:
            raise RuntimeError("no free recurrent-state slot (the scheduler admits at most max_batch sequences)")
        slot = self.free_slots.pop(0)
        for store in (self.conv, self.rec):
            for t in store.values():
                t[slot].zero_()
        return slot

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self.free_slots.append(slot)

    def begin(self, slots: list[int], counts: list[int]) -> StateStep:
        idx = torch.tensor(slots, device=next(iter(self.conv.values())).device)
        return StateStep({i: t.index_select(0, idx) for i, t in self.conv.items()},
                         {i: t.index_select(0, idx) for i, t in self.rec.items()}, counts,
                         keep_states=self.rollback == "per_row")

    def commit(self, step: StateStep, slots: list[int], keep: list[int]) -> None:
        """Make slot i's state the state after the first keep[i] rows of the step."""
        device = next(iter(self.conv.values())).device
        idx = torch.tensor(slots, device=device)
        keep_t = torch.tensor(keep, device=device)
        for i in self.layers:
            self.conv[i].index_copy_(0, idx, step.kept_conv(i, keep_t))
            if i in self.rec:
                self.rec[i].index_copy_(0, idx, step.kept_state(i, keep))
