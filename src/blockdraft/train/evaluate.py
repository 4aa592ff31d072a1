"""Teacher-forced acceptance of a drafter on cached sequences, and the trigram floor.

For greedy decoding, a step anchored at position a accepts the drafted tokens up to the first
that differs from the target's own continuation; the drafter's context there is the target's taps
of the committed tokens, and DSpark's Markov input is the previous token, which equals the drafted
one while the prefix is right. So on the target's greedy responses, with every response position
an anchor, AL = 1 + Σ_k P(slots 1..k all right) is what decoding those prompts accepts, read off
the cache without running the target. The trigram table is the floor a drafter must clear: the
most frequent continuation of the last 3..1 tokens in the training responses.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import torch

from ..drafters.registry import drafter_kind
from ..models.drafter import BlockDrafter
from .losses import blocks_at
from .tap_cache import CachedSeq, TapCache


@dataclass(frozen=True)
class Acceptance:
    mean_al: float                  # 1 + expected accepted drafts per step (full blocks only)
    per_position: list[float]       # P[AL > k], k = 1..n
    anchors: int

    def to_json(self) -> dict:
        return {"mean_al": self.mean_al, "per_position": self.per_position, "anchors": self.anchors}


def _full_block_anchors(seq: CachedSeq, n: int) -> torch.Tensor:
    lo, hi = seq.anchor_range
    return torch.arange(lo, max(lo, hi - n + 1))            # every slot lands inside the sequence


@torch.no_grad()
def forced_acceptance(drafter: BlockDrafter, cache: TapCache, indices: list[int], last_layer: int) -> Acceptance:
    """Greedy acceptance of `drafter` on cache sequences `indices`, every response anchor with a full block."""
    c = drafter.config
    n = c.num_draft_tokens
    reach, total = torch.zeros(n), 0
    for i in indices:
        seq = cache.seq(i)
        anchors = _full_block_anchors(seq, n)
        if not len(anchors):
            continue
        taps = cache.taps_for(seq, c.target_layer_ids, c.tap_point, last_layer)
        block = blocks_at(drafter, taps, None, seq.ids, anchors)
        z = drafter.logits(block.hidden).float()                                   # [M * n, Vd]
        z = drafter_kind(c.kind).forced_logits(drafter, z, block.prev)             # DSpark: + Markov bias
        right = (drafter.to_target(z.argmax(-1)) == block.labels).view(len(anchors), n)
        reach += right.int().cumprod(1).sum(0).float()                             # [n] anchors reaching k
        total += len(anchors)
    per_position = (reach / max(1, total)).tolist()
    return Acceptance(1 + sum(per_position), per_position, total)


class Trigram:
    """The most frequent next token after the last 3, 2 or 1 tokens (longest seen first), counted
    over response positions of the training sequences."""

    def __init__(self, seqs: list[tuple[list[int], int]], n: int = 3):
        counts = [defaultdict(Counter) for _ in range(n + 1)]
        for ids, start in seqs:
            for t in range(max(start, n), len(ids)):
                for k in range(1, n + 1):
                    counts[k][tuple(ids[t - k:t])][ids[t]] += 1
        self.n = n
        self.best = [{key: c.most_common(1)[0][0] for key, c in table.items()} for table in counts]

    def guess(self, ctx: list[int]) -> int | None:
        return next((self.best[k][tuple(ctx[-k:])] for k in range(self.n, 0, -1)
                     if len(ctx) >= k and tuple(ctx[-k:]) in self.best[k]), None)

    def acceptance(self, seqs: list[tuple[list[int], int]], block: int) -> Acceptance:
        """Greedy acceptance of drafting `block` tokens by the table (its own guesses fed back)."""
        reach, total = [0] * block, 0
        for ids, start in seqs:
            for a in range(max(1, start - 1), len(ids) - block):
                ctx, total = ids[:a + 1], total + 1
                for k in range(block):
                    if self.guess(ctx) != ids[a + 1 + k]:
                        break
                    reach[k] += 1
                    ctx = ctx + [ids[a + 1 + k]]
        per_position = [r / max(1, total) for r in reach]
        return Acceptance(1 + sum(per_position), per_position, total)
