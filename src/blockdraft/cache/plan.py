"""Capacity planning (docs/design.md §5): how many target KV blocks fit a byte budget.

Full-attention drafters keep one context row per committed token, so their KV is
billed *per target block* before the target capacity is chosen, plus one
query-spill block per batch row:

    target_blocks = (budget - spill) // (target_bytes_per_block + drafter_bytes_per_block)
    spill         = max_batch * drafter_bytes_per_block

Sliding-window drafters keep a fixed ring of `window + drafter block` rows per batch
row instead. Python ints do not overflow; sizes beyond int64 are refused anyway,
since they end up as tensor shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError

INT64_MAX = 2**63 - 1
PAGE_SIZE = 16                    # tokens per KV page unless configured


@dataclass(frozen=True)
class KVGeometry:
    """Bytes of K+V per token for one model: 2 × layers × kv_heads × head_dim × dtype bytes."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    def __post_init__(self):
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes"):
            _check_size(name, getattr(self, name))

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @classmethod
    def of(cls, cfg, model, num_layers: int | None = None) -> "KVGeometry":
        """The KV geometry of a target or drafter (or of `num_layers` of its layers) in its loaded dtype."""
        heads, dim = getattr(cfg, "paged_kv_geometry", (cfg.num_kv_heads, cfg.head_dim))
        return cls(cfg.num_layers if num_layers is None else num_layers, heads, dim,
                   torch.empty((), dtype=model.dtype).element_size())


@dataclass(frozen=True)
class CachePlan:
    page_size: int                  # tokens per KV page
    num_blocks: int                    # target blocks (drafter pool mirrors them when full-attention)
    target_bytes_per_block: int
    drafter_bytes_per_block: int       # 0 without a full-attention drafter
    spill_bytes: int                   # query-spill reserve (full attention) or the ring (sliding window)
    ring_rows_per_batch_row: int       # sliding-window drafters only
    total_bytes: int
    state_bytes: int = 0               # recurrent target state: one slot per batch row (hybrid targets)


def _check_size(name: str, value: int, allow_zero: bool = False) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    if value > INT64_MAX:
        raise ConfigError(f"{name}={value} is absurdly large (> int64)")


def plan_cache(budget_bytes: int, page_size: int, max_batch: int, max_model_len: int, lookahead: int,
               target: KVGeometry, drafter: KVGeometry | None = None, drafter_window: int | None = None,
               drafter_block_size: int = 0, drafter_ring: KVGeometry | None = None,
               state_bytes_per_seq: int = 0) -> CachePlan:
    """Choose the target block count for `budget_bytes`; refuse budgets that cannot hold one
    maximum-length sequence (max_model_len + lookahead tokens).

    `drafter` is the full-attention part of the drafter (billed per block); `drafter_ring` its
    sliding-window layers (a ring of window + drafter block rows per batch row). A drafter whose
    layers are all windowed may also be passed as `drafter` with `drafter_window` set.
    `state_bytes_per_seq`: a hybrid target's recurrent state per sequence, reserved for every batch row.
    """
    if drafter is not None and drafter_window is not None and drafter_ring is None:
        drafter, drafter_ring = None, drafter
    for name, value in (("budget_bytes", budget_bytes), ("page_size", page_size), ("max_batch", max_batch),
                        ("max_model_len", max_model_len)):
        _check_size(name, value)
    _check_size("lookahead", lookahead, allow_zero=True)
    if max_model_len % page_size:
        raise ConfigError(f"page_size={page_size} does not divide max_model_len={max_model_len}")
    target_bpb = target.bytes_per_token * page_size
    drafter_bpb = ring_rows = spill = 0
    if drafter is not None:
        drafter_bpb = drafter.bytes_per_token * page_size
        spill += max_batch * drafter_bpb
    if drafter_ring is not None:
        _check_size("drafter_window", drafter_window)
        ring_rows = drafter_window + drafter_block_size
        spill += max_batch * ring_rows * drafter_ring.bytes_per_token
    _check_size("state_bytes_per_seq", state_bytes_per_seq, allow_zero=True)
    state = max_batch * state_bytes_per_seq
    spill += state
    if spill >= budget_bytes:
        raise ConfigError(f"budget_bytes={budget_bytes} does not even cover the drafter reserve and recurrent "
                          f"state of {spill} bytes (max_batch={max_batch})")
    num_blocks = (budget_bytes - spill) // (target_bpb + drafter_bpb)
    needed = -(-(max_model_len + lookahead) // page_size)
    if num_blocks < needed:
        raise ConfigError(f"budget_bytes={budget_bytes} holds {num_blocks} pages of {page_size} tokens, but one "
                          f"sequence of max_model_len={max_model_len} (+{lookahead} lookahead) needs {needed}")
    _check_size("num_blocks", num_blocks)
    total = spill + num_blocks * (target_bpb + drafter_bpb)
    return CachePlan(page_size, num_blocks, target_bpb, drafter_bpb, spill - state, ring_rows, total, state)


def budget_for(max_batch: int, max_len: int, target: KVGeometry, drafter: KVGeometry | None = None,
               lookahead: int = 0, drafter_window: int | None = None, drafter_block_size: int = 0,
               page_size: int = PAGE_SIZE, state_bytes_per_seq: int = 0) -> int:
    """Bytes for `max_batch` sequences of `max_len` tokens (+ lookahead), target and drafter KV, in
    whole pages, plus one spare sequence of pages for the drafter's query spill; what `plan_cache`
    needs to hold them."""
    bytes_per_token = target.bytes_per_token + (drafter.bytes_per_token if drafter is not None else 0)
    tokens = (max_batch + 1) * (-(-(max_len + lookahead + 1) // page_size) + 1) * page_size
    ring = max_batch * (drafter_window + drafter_block_size) if drafter is not None and drafter_window else 0
    return (tokens + ring) * bytes_per_token + max_batch * state_bytes_per_seq
