"""How many CPU threads a step runs: the process's thread count, or one, whichever measures faster.

On an idle machine the extra threads speed a step up; on a shared one whose other cores are busy,
each of a step's ~90 parallel regions waits at its barrier for a thread that is not scheduled, and
one thread is several times faster. Which holds can change while a process runs, so it is measured
online, like the draft width (`policy.py`): per batch bucket and draft width, each thread count's
decode time (the median of its last `RECENT` steps, so that one step the host delayed does not move a
process onto one thread for the steps until the next look), the faster one runs, and it looks at the other
once `every` steps have passed and the steps since its last look have earned, at `share` of their
time, what a look is expected to lose — so the dearer the other count, the rarer the looks.
Every kernel gives the same bits at any thread count (tested), so the choice never changes output.
A step at a count other than the one the choice runs (`looks_at`: run only to measure it) is not what the
width costs: the width policy leaves its time out (a one-thread look costs ~1.8x a two-thread step on a
2-core machine, and counted, each width's first look raised its cost estimate by ~20%, enough to keep the
policy a width or two narrower than its best).
"""

from __future__ import annotations

import statistics
from collections import deque

import torch

RECENT = 5


class ThreadChoice:
    def __init__(self, most: int | None = None, every: int = 32, share: float = 0.01, enabled: bool = True):
        self.most = most or torch.get_num_threads()
        self.options = [self.most, 1] if enabled and self.most > 1 else [self.most]
        self.every, self.share = every, share
        self.cost: dict[tuple, float] = {}       # (bucket, width, threads) -> seconds per decode step
        self.recent: dict[tuple, deque] = {}     # (bucket, width, threads) -> its last RECENT steps' seconds
        self.since: dict[tuple, int] = {}        # (bucket, width) -> decode steps since the last look
        self.current = self.most                  # the count the last decode step chose as the faster

    def pick(self, key: tuple) -> int:
        """The thread count for a decode step of this (batch bucket, width)."""
        if len(self.options) == 1:
            return self.most
        n = self.since[key] = self.since.get(key, 0) + 1
        unmeasured = [t for t in self.options if (*key, t) not in self.cost]
        if unmeasured:                            # the count it runs now first: that step is what the width costs
            return self.current if self.current in unmeasured else unmeasured[0]
        best, other = sorted(self.options, key=lambda t: self.cost[(*key, t)])
        self.current = best
        if n >= max(self.every, (self.cost[(*key, other)] / self.cost[(*key, best)] - 1) / self.share):
            self.since[key] = 0
            return other
        return best

    def looks_at(self, threads: int) -> bool:
        """Whether a step `pick` gave `threads` runs them only to measure them (not the count it runs now)."""
        return threads != self.current

    def record(self, key: tuple, threads: int, seconds: float) -> None:
        recent = self.recent.setdefault((*key, threads), deque(maxlen=RECENT))
        recent.append(seconds)
        self.cost[(*key, threads)] = statistics.median(recent)
