"""When drafting stops paying: decide per step from measured costs at the current batch size.

A drafting step commits `mean_al` tokens per sequence and costs `c_spec`; a plain
step commits 1 and costs `c_ar`. Draft while `mean_al * c_ar >= c_spec`. Costs are
measured online (EMA per batch size); each mode is tried first and re-explored now
and then. Only greedy sequences ever skip drafting: their output is identical
either way, while seeded sampled runs must consume randomness the same way
whatever the batch, so they always draft.
"""

from __future__ import annotations

from collections import defaultdict


class SpeculationPolicy:
    def __init__(self, enabled: bool = True, explore_every: int = 32, smoothing: float = 0.2):
        self.enabled, self.explore_every, self.smoothing = enabled, explore_every, smoothing
        self.cost: dict[tuple[bool, int], float] = {}        # (drafting, batch) -> seconds per step
        self.mean_al: float | None = None                    # tokens per sequence per drafting step
        self.steps: defaultdict[int, int] = defaultdict(int)

    @staticmethod
    def bucket(batch: int) -> int:
        """Costs are pooled per power-of-two batch size, so estimates settle quickly."""
        return 1 << (batch - 1).bit_length()

    def should_draft(self, batch: int) -> bool:
        if not self.enabled:
            return True
        batch = self.bucket(batch)
        self.steps[batch] += 1
        spec, ar = self.cost.get((True, batch)), self.cost.get((False, batch))
        if spec is None or self.mean_al is None:
            return True
        if ar is None:
            return False
        choice = self.mean_al * ar >= spec
        if self.steps[batch] % self.explore_every == 0:
            return not choice                                 # keep the other estimate fresh
        return choice

    def record(self, drafting: bool, batch: int, seconds: float, tokens_per_seq: float) -> None:
        key = (drafting, self.bucket(batch))
        old = self.cost.get(key)
        self.cost[key] = seconds if old is None else old + self.smoothing * (seconds - old)
        if drafting:
            self.mean_al = tokens_per_seq if self.mean_al is None else \
                self.mean_al + self.smoothing * (tokens_per_seq - self.mean_al)
