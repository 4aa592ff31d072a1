"""KV storage behind one small interface, so contiguous and paged caches are interchangeable.

A forward pass asks its cache for a *step view* of the rows it is about to add:
`positions` [batch, t] (absolute), `visible` [batch, 1, t, keys] and `kv(layer, k, v)`,
which stores the new rows and returns every key/value the rows may attend to.
K/V are written by absolute position and a length says what is valid, so a rejected
draft is simply overwritten by the next step: rollback is `truncate(n)`, O(1).

`KVCache` is the contiguous single-stream cache; `cache/paged.py` holds the paged
batch version with the same `StepView` shape.
"""

from __future__ import annotations

import torch

from ..cache.views import ContextRead, KernelKV, causal_visibility


class KVCache:
    """`states`: the recurrent state of a hybrid target (`cache/state.py`, batch row i = slot i). It
    cannot roll back by length: `truncate(n)` after a forward keeps that forward's first `n - start`
    rows (the state replayed as `StatePool.commit` does), and may not go below its start."""

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", capacity: int = 256, states=None,
                 geometry: list[tuple[int, int]] | None = None):
        """`geometry`: (kv heads, head dim) per layer where layers differ (Gemma 4's full layers)."""
        shapes = [(batch, h, capacity, d) for h, d in (geometry or [(num_kv_heads, head_dim)] * num_layers)]
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.length = 0  # tokens whose K/V are committed
        self.states = states
        self._pending = None  # (start, rows, StateStep) of the last forward, until truncate commits it

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

    def begin(self, t: int, causal: bool = True) -> "ContiguousStep":
        """A view for t new rows at positions length..length+t-1 (not committed until truncate)."""
        self.reserve(self.length + t)
        step = ContiguousStep(self, self.length, t, causal)
        if self.states is not None:
            self._commit_pending(self.length)      # a forward never truncated after keeps none of its rows
            b = self.k[0].shape[0]
            step.state = self.states.begin(list(range(b)), [t] * b)
            self._pending = (self.length, t, step.state)
        return step

    def truncate(self, length: int) -> None:
        """Keep only positions [0, length): the accepted prefix."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"cannot truncate cache to length {length} (capacity {self.capacity})")
        if self.states is not None:
            self._commit_pending(length)
        self.length = length

    def _commit_pending(self, length: int) -> None:
        """Make the recurrent state the state after position `length - 1`."""
        if self._pending is None:
            if length < self.length:
                raise ValueError(f"cannot roll a recurrent state back to {length} (committed through "
                                 f"{self.length}): truncate right after the forward that wrote those rows")
            return
        start, t, step = self._pending
        if not start <= length <= start + t:
            raise ValueError(f"cannot keep {length} positions: the last forward wrote rows {start}..{start + t - 1}")
        b = self.k[0].shape[0]
        self.states.commit(step, list(range(b)), [length - start] * b)
        self._pending = None

    def context(self) -> ContextRead:
        """Everything committed, as the drafter's block reads it."""
        b, n = self.k[0].shape[0], self.length
        device = self.k[0].device
        positions = torch.arange(n, device=device).expand(b, n)
        valid = torch.ones(b, n, dtype=torch.bool, device=device)
        layers = len(self.k)
        return ContextRead([k[:, :, :n] for k in self.k], [v[:, :, :n] for v in self.v], [positions] * layers,
                           [valid] * layers, torch.full((b,), n, dtype=torch.long, device=device))


class ContiguousStep:
    def __init__(self, cache: KVCache, start: int, t: int, causal: bool):
        self.cache, self.start, self.end = cache, start, start + t
        b, device = cache.k[0].shape[0], cache.k[0].device
        self.positions = torch.arange(start, self.end, device=device).expand(b, t)
        k_pos = torch.arange(self.end, device=device).expand(b, self.end)
        self.visible = causal_visibility(self.positions, k_pos) if causal else None

    def kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [b, hkv, t, d] at their positions; return all K/V up to the last new row."""
        self.cache.k[layer][:, :, self.start:self.end] = k
        self.cache.v[layer][:, :, self.start:self.end] = v
        return self.cache.k[layer][:, :, :self.end], self.cache.v[layer][:, :, :self.end]

    def kernel_kv(self) -> KernelKV:
        """The cache as slots: (batch i, position p) is slot i * hkv * capacity + p of each layer's
        [b, hkv, capacity, d] buffer."""
        b, hkv, cap, d = self.cache.k[0].shape
        base = torch.arange(b, device=self.positions.device)[:, None] * (hkv * cap)                 # [b, 1]
        return KernelKV(self.cache.k, self.cache.v, (base + self.positions).view(-1),
                        base + torch.arange(self.end, device=base.device), d, cap * d, self.visible)
