"""How many drafts to verify this step: the width that maximises committed tokens per second.

With k drafts a sequence commits `E(k) = 1 + sum_{i<=k} P(the first i drafts are accepted)`
tokens per step; the step costs `cost(batch, k)` (drafter pass + verify of k+1 rows per
sequence; k = 0 is a plain decoding step). Both are measured online: P from running
per-position acceptance (drafts are prefix-consistent — slot i does not depend on how many
slots are verified — so a step with k drafts also informs every narrower width), cost as an
EMA of measured step time per power-of-two batch bucket and width. The widest width is tried
first (it measures every slot's acceptance), then a plain step; a width in between is tried only
when its cost, interpolated between measured neighbours, says it could win (so a drafter that
cannot pay costs two exploratory steps, not one per width). The best is then used with one
exploratory step in `explore_every` at a width next to it (a neighbour costs little to try; a far
one can cost 3x a step at batch 8; while drafting, a plain step is among those looked at, so its
cost is not left stale), so a machine whose verify is cheap (AMX) drafts wide and one
whose verify is dear (emulated bf16, large batches) drafts narrow or not at all. While plain
decoding stays best the interval doubles at each look (up to `max_backoff` x), so a drafter that
cannot pay here costs ever fewer exploratory steps (each one also writes the drafter context the
plain steps deferred); it is reset as soon as drafting wins again.

What a policy measured can be kept per machine (`state`/`restore`; `LLMEngine(policy_file=...)`,
which `generate` and `serve` use): a new process then starts from the costs and acceptance an
earlier one measured instead of exploring again (on the default model the first 288 steps paid
~10% for that exploration), and keeps refining them.

Only greedy sequences follow the policy: their output is the same at any width. Sampled
sequences always draft the full (capped) width, so a seeded run consumes randomness the same
way whatever the timing or the batch.
"""

from __future__ import annotations

from collections import defaultdict


class DraftWidthPolicy:
    def __init__(self, max_width: int, enabled: bool = True, explore_every: int = 32, smoothing: float = 0.25,
                 margin: float = 1.05, max_backoff: int = 8):
        self.max_width, self.enabled, self.margin = max_width, enabled and max_width > 0, margin
        self.explore_every, self.smoothing, self.max_backoff = explore_every, smoothing, max_backoff
        # every width up to 8 (the best one moves with the numerics: a 4-bit target's extra verify rows
        # cost ~17% of a step each, bf16-on-AMX rows ~2%), powers of two beyond
        self.widths = sorted({0, max_width} | set(range(1, min(max_width, 8) + 1))
                             | {w for w in (12, 16) if w < max_width}) if self.enabled else [max_width]
        self.cost: dict[tuple[int, int], float] = {}          # (batch bucket, width) -> seconds per step
        self.trials = [0] * (max_width + 1)                   # sequence-steps that drafted >= i
        self.hits = [0] * (max_width + 1)                     # ... of which the first i were all accepted
        self.steps: defaultdict[int, int] = defaultdict(int)
        self.next_look: defaultdict[int, int] = defaultdict(lambda: self.explore_every)   # bucket -> step of its next look
        self.backoff: defaultdict[int, int] = defaultdict(lambda: 1)  # bucket -> interval / explore_every

    @staticmethod
    def bucket(batch: int) -> int:
        return 1 << (batch - 1).bit_length()

    def expected_tokens(self, width: int) -> float:
        """E(width): committed tokens per sequence per step. P(first i accepted) is shrunk towards
        P(first i-1) by one pseudo-trial (optimistic before any data) and never rises with i."""
        total, p = 1.0, 1.0
        for i in range(1, width + 1):
            p = min(p, (self.hits[i] + p) / (self.trials[i] + 1))
            total += p
        return total

    def _cost(self, b: int, width: int) -> float | None:
        """Measured step cost at `width`, else interpolated between the nearest measured widths."""
        if (b, width) in self.cost:
            return self.cost[(b, width)]
        known = [w for w in self.widths if (b, w) in self.cost]
        lo = max((w for w in known if w < width), default=None)
        hi = min((w for w in known if w > width), default=None)
        if lo is None or hi is None:
            return None
        return self.cost[(b, lo)] + (self.cost[(b, hi)] - self.cost[(b, lo)]) * (width - lo) / (hi - lo)

    def choose(self, batch: int) -> int:
        """The width for this step's greedy sequences."""
        if not self.enabled:
            return self.max_width
        b = self.bucket(batch)
        self.steps[b] += 1
        for end in (self.max_width, 0):      # the widest first (it measures every slot), then a plain step
            if (b, end) not in self.cost:
                return end
        # other widths are tried only when their interpolated cost says they could win
        rate = {w: self.expected_tokens(w) / self._cost(b, w) for w in self.widths}
        best = max(self.widths, key=lambda w: (rate[w], -w))
        if (b, best) not in self.cost:
            return best
        if best and rate[best] < self.margin * rate[0]:
            best = 0      # drafting must win clearly: its context upkeep is not all in the step's time
        if best:
            self.backoff[b] = 1
        if self.steps[b] >= self.next_look[b]:                  # keep the neighbours' estimates fresh
            self.next_look[b] = self.steps[b] + self.explore_every * self.backoff[b]
            if not best:
                self.backoff[b] = min(2 * self.backoff[b], self.max_backoff)
            at = self.widths.index(best)
            near = self.widths[max(0, at - 1):at] + self.widths[at + 1:at + 2]
            if best and 0 not in near:      # keep the plain step's cost fresh too: measured once in a slow
                near.append(0)              # spell and never again, it would keep a losing width drafting
            return near[(self.steps[b] // self.explore_every) % len(near)]
        return best

    def state(self) -> dict:
        """What was measured: step cost per (batch bucket, width), per-slot acceptance counts, and each
        bucket's exploration backoff."""
        return {"max_width": self.max_width, "cost": [[b, w, s] for (b, w), s in sorted(self.cost.items())],
                "trials": self.trials, "hits": self.hits, "backoff": sorted(self.backoff.items())}

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
        scale = min(1.0, weight / max(1, trials[1] if len(trials) > 1 else 0))
        self.cost = cost
        self.trials = [round(t * scale) for t in trials]
        self.hits = [min(round(h * scale), t) for h, t in zip(hits, self.trials)]
        for b, k in state.get("backoff", ()):       # the next look comes as late as the last run had backed off
            self.backoff[int(b)] = min(max(1, int(k)), self.max_backoff)
            self.next_look[int(b)] = self.explore_every * self.backoff[int(b)]
        return True

    def record(self, batch: int, width: int, seconds: float, drafted: list[int], accepted: list[int]) -> None:
        """One decode step: its time at `width`, and each sequence's drafted / accepted counts."""
        key = (self.bucket(batch), width)
        old = self.cost.get(key)
        self.cost[key] = seconds if old is None else old + self.smoothing * (seconds - old)
        for n, a in zip(drafted, accepted):
            for i in range(1, n + 1):
                self.trials[i] += 1
                self.hits[i] += a >= i
