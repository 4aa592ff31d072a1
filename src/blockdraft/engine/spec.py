"""`ModelSpec`: what the engine knows of the models it serves, whoever runs them.

The engine sizes its cache, admits requests and schedules drafts from this record alone: the
target's vocabulary, context and KV geometry, its per-sequence state, and the drafter's block,
window and KV geometry. `ModelSpec.of(target, drafter)` reads it off torch modules (the one place
the engine's side of the code reads their configs); the ONNX runner builds one from an export's
dimensions (`onnx_runner.onnx_spec`). The runner that executes the models builds the pools the
resulting `CachePlan` sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache.plan import KVGeometry, budget_for


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter as the engine plans for it."""

    kind: str
    num_draft_tokens: int               # drafts a step may verify (the block minus its anchor)
    block_size: int
    kv: KVGeometry                      # all of its layers
    full_layers: tuple[int, ...]        # layers on the paged pool (full attention)
    ring_layers: tuple[int, ...] = ()   # layers on a per-sequence ring (sliding window)
    window: int | None = None           # the drafter's sliding window (its ring layers' window)

    def layer_kv(self, layers: tuple[int, ...]) -> KVGeometry | None:
        """The KV geometry of `layers` of this drafter, or None where there are none."""
        if not layers:
            return None
        return KVGeometry(len(layers), self.kv.num_kv_heads, self.kv.head_dim, self.kv.dtype_bytes)


@dataclass(frozen=True)
class ModelSpec:
    """A target (and its drafter) as the engine plans for them."""

    vocab_size: int
    max_position_embeddings: int
    kv: KVGeometry                      # the target's attention layers
    device: torch.device
    state_bytes: int = 0                # per-sequence state of a hybrid target's recurrent / conv / window layers
    no_prefix_sharing: str | None = None   # why a prefix cache hit would be wrong for this target, or None
    drafter: DrafterSpec | None = None

    @classmethod
    def of(cls, target, drafter=None) -> "ModelSpec":
        """The spec of torch modules: a `TargetModel` and a `BlockDrafter` (or None)."""
        tc = target.config
        state_bytes, refusal = 0, None
        if tc.hybrid:
            state_bytes = tc.state_layout.bytes_per_slot(target.dtype)
            kinds = "/".join(sorted({tc.layer_type(i) for i in tc.state_layers}))
            refusal = (f"refused for {tc.architecture}: its {kinds} layers keep a per-sequence state (a recurrent "
                       "state, conv rows or a sliding window's K/V), and a prefix hit would need that state at the "
                       "block boundary")
        spec = None
        if drafter is not None:
            dc = drafter.config
            ring = tuple(i for i in range(dc.num_layers) if dc.layer_window(i))
            spec = DrafterSpec(dc.kind, dc.num_draft_tokens, dc.block_size, KVGeometry.of(dc, drafter),
                               tuple(i for i in range(dc.num_layers) if not dc.layer_window(i)), ring,
                               dc.sliding_window)
        return cls(tc.vocab_size, tc.max_position_embeddings, KVGeometry.of(tc, target, len(tc.attention_layers)),
                   target.device, state_bytes, refusal, spec)

    @property
    def lookahead(self) -> int:
        """Drafts a step may verify at most (0 without a drafter)."""
        return self.drafter.num_draft_tokens if self.drafter is not None else 0

    def cache_budget(self, max_len: int, max_batch: int) -> int:
        """Bytes for `max_batch` sequences of `max_len` tokens (+ lookahead): target and drafter KV, and state."""
        d = self.drafter
        if d is None:
            return budget_for(max_batch, max_len, self.kv, state_bytes_per_seq=self.state_bytes)
        return budget_for(max_batch, max_len, self.kv, d.kv, d.num_draft_tokens, d.window,
                          d.block_size, state_bytes_per_seq=self.state_bytes)
