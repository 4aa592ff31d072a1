"""How many drafts to verify this step: the width that maximises committed tokens per second.

With k drafts a sequence commits `E(k) = 1 + sum_{i<=k} P(the first i drafts are accepted)`
tokens per step; the step costs `cost(batch, k)` (drafter pass + verify of k+1 rows per
sequence; k = 0 is a plain decoding step). Both are measured online: P from running
per-position acceptance (drafts are prefix-consistent — slot i does not depend on how many
slots are verified — so a step with k drafts also informs every narrower width), cost per
power-of-two batch bucket and width (a lower sample moves the estimate halfway, a higher one a
quarter: timing noise on a shared machine is mostly slowdowns, so a cost measured in a slow
spell must not linger). A step's cost leaves out drafter context it wrote for earlier steps that
did not draft (`StepOutputs.catch_up_s`): a look at a drafting width after plain steps would
otherwise carry their upkeep. A width not measured in a bucket is interpolated between its measured
neighbours, or else scaled from the nearest bucket that measured it (its cost relative to that
bucket's plain step), so a new bucket starts from a plain step and tries only what could win.
A narrower step does a subset of a wider one's work (fewer verify rows; a plain step no drafter pass),
so no width's cost stays above a wider width's measured cost: an estimate that does was measured in a
slow spell and is lowered to it (else a plain step measured 70x too dear — one was, in a persisted
state — would never be looked at again: its expected loss would always exceed the look budget).
The widest width is tried `WIDE_TRIES` times per process, one after another (it measures every
slot's acceptance; one step is too few to judge the deep slots by), and its cost is the cheapest of
those steps: the first drafting step pays one-time costs, and the engine's thread choice may time
another thread count on the next (measured on the LFM2-1.2B shape: 146 and 174 ms, then 104 ms a
step; a running estimate of the three is ~1.5x the warm cost, and every drafting width interpolated
from it that much dearer). A step the engine ran at a thread count it was only measuring (`record(...,
timed=False)`: engine/threads.py's looks, a one-thread step ~1.8x a two-thread one on 2 cores) is not a
width's cost and is left out; counted, each width's first such look kept the policy a width or two
narrower than its best.

A drafting width must also win against the plain step's lowest cost among its last `PLAIN_LOW`
samples, not only against its running estimate: a slow spell raises that estimate (and the rule
above caps it at a drafting width's cost), after which any drafter whose first slot is ever
accepted would look like a win and draft for the whole stretch until a look measured plain again
(measured: a width-1 step at 1.4x a plain one, 11% more tokens, drafting at mean width 0.7 through
requests at 0.86x of plain decoding).

Exploration has a budget: every step earns `explore_share` of its time as credit, and a look at
a width next to the best one (a plain step among them while drafting, so its cost is not left
stale; the widest among them while plain, since a look at width 1 measures slot 1 alone and the
deep slots' estimates may rest on a few unlucky measuring steps) is taken only when the credit
covers what the look is expected to lose against the best width, and at most once in `min_gap`
steps. A look from plain decoding first writes the drafter context the plain steps before it owed:
its expected loss counts that too, at the time per owed step the last such write took (`upkeep`), so
a drafter whose context costs more a step than the budget earns is not looked at again in that
stretch (left out, a drafter that cannot pay here cost a few times the share: measured at 0.01,
1.5-4%); a smaller share looks less often, and so finds a paying width later after unlucky
measuring steps (docs/benchmarks.md).
A machine whose verify is cheap (AMX) drafts wide while one whose verify is dear (emulated bf16,
large batches) drafts narrow or not at all.

What a policy measured can be kept per machine (`state`/`restore`; `LLMEngine(policy_file=...)`,
which `generate` and `serve` use): a new process then starts from the costs and acceptance an
earlier one measured instead of exploring again, and keeps refining them.

Only greedy sequences follow the policy: their output is the same at any width. Sampled
sequences always draft the full (capped) width, so a seeded run consumes randomness the same
way whatever the timing or the batch.
"""

from __future__ import annotations

from collections import defaultdict, deque


WIDE_TRIES = 3
PLAIN_LOW = 16          # plain steps whose lowest cost a drafting width must beat
PRIOR_STEPS = 16        # pseudo-steps behind a deep slot's assumed acceptance (the slot before it's) until measured


class DraftWidthPolicy:
    def __init__(self, max_width: int, enabled: bool = True, explore_share: float = 0.01, min_gap: int = 32,
                 margin: float = 1.05):
        self.max_width, self.enabled, self.margin = max_width, enabled and max_width > 0, margin
        self.explore_share, self.min_gap = explore_share, min_gap
        # every width up to 8 (the best one moves with the numerics: a 4-bit target's extra verify rows
        # cost ~17% of a step each, bf16-on-AMX rows ~2%), powers of two beyond
        self.widths = sorted({0, max_width} | set(range(1, min(max_width, 8) + 1))
                             | {w for w in (12, 16) if w < max_width}) if self.enabled else [max_width]
        self.cost: dict[tuple[int, int], float] = {}          # (batch bucket, width) -> seconds per step
        self.trials = [0] * (max_width + 1)                   # sequence-steps that drafted >= i
        self.hits = [0] * (max_width + 1)                     # ... of which the first i were all accepted
        self.credit: defaultdict[int, float] = defaultdict(float)   # bucket -> seconds earned for looks
        self.since_look: defaultdict[int, int] = defaultdict(int)   # bucket -> steps since its last look
        self.looks: defaultdict[int, int] = defaultdict(int)        # bucket -> looks taken (rotates the target)
        self.wide_steps = 0                                   # steps this process took at the widest width
        self.plain_recent: defaultdict[int, deque] = defaultdict(lambda: deque(maxlen=PLAIN_LOW))  # bucket -> s
        self.owed: defaultdict[int, int] = defaultdict(int)         # bucket -> plain steps since it last drafted
        self.upkeep: dict[int, float] = {}                          # bucket -> s of drafter context per owed step

    @staticmethod
    def bucket(batch: int) -> int:
        return 1 << (batch - 1).bit_length()

    def expected_tokens(self, width: int) -> float:
        """E(width): committed tokens per sequence per step. P(first i accepted) = P(first i-1) q_i, where
        q_i, slot i's acceptance once the slots before it were accepted, is measured over the steps that
        drafted slot i (hits[i] of the trials[i] P(first i-1) that reached it) beside `PRIOR_STEPS`
        pseudo-steps at q_{i-1} (slot 1: one pseudo-step at 1, optimistic before any data)."""
        total, p, q = 1.0, 1.0, 1.0
        for i in range(1, width + 1):
            prior = 1 if i == 1 else PRIOR_STEPS
            q = min(1.0, (self.hits[i] + prior * q) / (self.trials[i] * p + prior))
            p *= q
            total += p
        return total

    def _bucket_cost(self, b: int, width: int) -> float | None:
        """Step cost at `width` as bucket `b` measured it, else interpolated between its nearest measured widths."""
        if (b, width) in self.cost:
            return self.cost[(b, width)]
        known = [w for w in self.widths if (b, w) in self.cost]
        lo = max((w for w in known if w < width), default=None)
        hi = min((w for w in known if w > width), default=None)
        if lo is None or hi is None:
            return None
        return self.cost[(b, lo)] + (self.cost[(b, hi)] - self.cost[(b, lo)]) * (width - lo) / (hi - lo)

    def _cost(self, b: int, width: int) -> float | None:
        """`_bucket_cost`, or else the nearest other bucket's cost relative to its plain step, scaled by this
        bucket's plain step."""
        own = self._bucket_cost(b, width)
        if own is not None or (b, 0) not in self.cost:
            return own
        for other in sorted({k for k, _ in self.cost if k != b}, key=lambda k: abs(k.bit_length() - b.bit_length())):
            theirs = self._bucket_cost(other, width)
            if theirs is not None and (other, 0) in self.cost:
                return self.cost[(b, 0)] * theirs / self.cost[(other, 0)]
        return None

    def choose(self, batch: int) -> int:
        """The width for this step's greedy sequences."""
        if not self.enabled:
            return self.max_width
        b = self.bucket(batch)
        if (b, 0) not in self.cost:          # a plain step first: cheap, and other buckets' costs scale from it
            return 0
        if self.wide_steps < WIDE_TRIES:
            return self.max_width            # the widest measures every slot's acceptance
        rate = {w: self.expected_tokens(w) / c for w in self.widths if (c := self._cost(b, w)) is not None}
        best = max(rate, key=lambda w: (rate[w], -w))
        if (b, best) not in self.cost:       # estimated (interpolated or scaled) to win: measure it
            return best
        plain = min(self.plain_recent[b], default=self.cost[(b, 0)])
        if best and rate[best] < self.margin * max(rate[0], 1.0 / plain):
            best = 0      # drafting must win clearly: its context upkeep is not all in the step's time
        self.since_look[b] += 1
        if self.since_look[b] < self.min_gap:
            return best
        at = self.widths.index(best)
        near = self.widths[max(0, at - 1):at] + self.widths[at + 1:at + 2]
        if best and 0 not in near:           # keep the plain step's cost fresh too: measured once in a slow
            near.append(0)                   # spell and never again, it would keep a losing width drafting
        if not best and self.max_width not in near:   # and while plain, the widest: a look at width 1 measures
            near.append(self.max_width)               # slot 1 only, and the deep slots' few samples may be unlucky
        look = near[self.looks[b] % len(near)]
        cost = self._cost(b, look)
        loss = self.cost[(b, 0)] if cost is None else cost - self.expected_tokens(look) / rate[best]
        if look and not best:                # the context the plain steps since the last drafting step owe
            loss += self.upkeep.get(b, 0.0) * self.owed[b]
        if self.credit[b] < loss:
            return best
        self.credit[b], self.since_look[b] = 0.0, 0
        self.looks[b] += 1
        return look

    def state(self) -> dict:
        """What was measured: step cost per (batch bucket, width) and per-slot acceptance counts."""
        return {"max_width": self.max_width, "cost": [[b, w, s] for (b, w), s in sorted(self.cost.items())],
                "trials": self.trials, "hits": self.hits, "upkeep": [[b, s] for b, s in sorted(self.upkeep.items())]}

    def restore(self, state: dict, weight: int = 256) -> bool:
        """Start from an earlier `state()` of the same width (False: not one); its acceptance counts
        weigh as at most `weight` steps, so this run's own outweigh them soon."""
        if state.get("max_width") != self.max_width or len(state.get("trials", ())) != self.max_width + 1:
            return False
        cost = {(int(b), int(w)): float(s) for b, w, s in state["cost"]}
        trials, hits = [int(t) for t in state["trials"]], [int(h) for h in state["hits"]]
        if len(hits) != len(trials) or not all(0 <= h <= t for h, t in zip(hits, trials)) or \
                not all(w in self.widths and s > 0 for (_, w), s in cost.items()):
            return False
        upkeep = {int(b): float(s) for b, s in state.get("upkeep", ())}     # (absent from older states)
        if not all(s >= 0 for s in upkeep.values()):
            return False
        scale = min(1.0, weight / max(1, trials[1] if len(trials) > 1 else 0))
        self.cost, self.upkeep = cost, upkeep
        for b in {b for b, _ in cost}:
            self._monotone(b)
        if any(w for _, w in cost):          # an earlier process measured the slots: no need to again
            self.wide_steps = WIDE_TRIES
        self.trials = [round(t * scale) for t in trials]
        self.hits = [min(round(h * scale), t) for h, t in zip(hits, self.trials)]
        return True

    def _record_cost(self, key: tuple[int, int], width: int, seconds: float) -> None:
        measuring = width == self.max_width and self.wide_steps < WIDE_TRIES
        self.wide_steps += width == self.max_width
        old = self.cost.get(key)
        if old is None:
            self.cost[key] = seconds
        elif measuring:
            self.cost[key] = min(old, seconds)
        else:
            self.cost[key] = old + (0.5 if seconds < old else 0.25) * (seconds - old)
        if width == 0:
            self.plain_recent[key[0]].append(seconds)
        self._monotone(key[0])

    def _monotone(self, b: int) -> None:
        """Lower bucket `b`'s measured costs so that none exceeds a wider width's (see the module docstring)."""
        cheapest_wider = float("inf")
        for w in sorted((w for bb, w in self.cost if bb == b), reverse=True):
            self.cost[(b, w)] = cheapest_wider = min(self.cost[(b, w)], cheapest_wider)

    def record(self, batch: int, width: int, seconds: float, drafted: list[int], accepted: list[int],
               upkeep: float = 0.0, timed: bool = True) -> None:
        """One decode step: its time at `width` (without `upkeep`, the time of the drafter context it wrote for
        earlier steps that did not draft), and each sequence's drafted / accepted counts. `timed` False: the
        step ran at a thread count the engine was only measuring (engine/threads.py), so its time is not
        `width`'s cost; its acceptance counts all the same."""
        key = (self.bucket(batch), width)
        if timed:
            self._record_cost(key, width, seconds)
            if width and self.owed[key[0]] and upkeep:
                self.upkeep[key[0]] = upkeep / self.owed[key[0]]
        self.credit[key[0]] += self.explore_share * seconds
        self.owed[key[0]] = 0 if width else self.owed[key[0]] + 1
        for n, a in zip(drafted, accepted):
            for i in range(1, n + 1):
                self.trials[i] += 1
                self.hits[i] += a >= i
