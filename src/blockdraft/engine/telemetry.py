"""Speculation and cache statistics, per request and global, in a form /metrics can export."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SpecStats:
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    al_histogram: Counter = field(default_factory=Counter)        # acceptance length -> steps
    position_attempts: Counter = field(default_factory=Counter)   # draft slot i -> times drafted
    position_accepted: Counter = field(default_factory=Counter)   # draft slot i -> times accepted

    def record_step(self, drafted: int, accepted: int, produced: int) -> None:
        self.verify_steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.al_histogram[produced] += 1
        for i in range(drafted):
            self.position_attempts[i] += 1
            if i < accepted:
                self.position_accepted[i] += 1

    @property
    def mean_acceptance_length(self) -> float:
        return sum(k * v for k, v in self.al_histogram.items()) / self.verify_steps if self.verify_steps else 0.0

    def per_position_acceptance(self) -> list[float]:
        return [self.position_accepted[i] / self.position_attempts[i] for i in sorted(self.position_attempts)]


@dataclass
class EngineStats:
    spec: SpecStats = field(default_factory=SpecStats)
    steps: int = 0
    requests_finished: Counter = field(default_factory=Counter)  # finish reason -> count
    ttft_s: list[float] = field(default_factory=list)
    preemptions: int = 0
    num_waiting: int = 0
    num_running: int = 0
    blocks_total: int = 0
    blocks_free: int = 0
    prefix_hits: int = 0
    prefix_queries: int = 0
    busy_s: float = 0.0

    @property
    def cache_utilization(self) -> float:
        return 1 - self.blocks_free / self.blocks_total if self.blocks_total else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.spec.generated / self.busy_s if self.busy_s else 0.0

    def snapshot(self) -> dict:
        s = self.spec
        return {"steps": self.steps, "verify_steps": s.verify_steps, "drafted": s.drafted, "accepted": s.accepted,
                "generated": s.generated, "mean_acceptance_length": s.mean_acceptance_length,
                "al_histogram": dict(sorted(s.al_histogram.items())),
                "per_position_acceptance": s.per_position_acceptance(), "tokens_per_s": self.tokens_per_s,
                "ttft_s": list(self.ttft_s), "preemptions": self.preemptions, "num_waiting": self.num_waiting,
                "num_running": self.num_running, "cache_utilization": self.cache_utilization,
                "blocks_free": self.blocks_free, "blocks_total": self.blocks_total,
                "prefix_cache_hits": self.prefix_hits, "prefix_cache_queries": self.prefix_queries,
                "requests_finished": dict(self.requests_finished)}


class Rates:
    """Throughput and mean acceptance of a finished generation (token_ids, acceptance_lengths, timing)."""

    @property
    def tokens_per_s(self) -> float:
        total = self.prefill_s + self.decode_s
        return len(self.token_ids) / total if total > 0 else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        a = self.acceptance_lengths
        return sum(a) / len(a) if a else 0.0
