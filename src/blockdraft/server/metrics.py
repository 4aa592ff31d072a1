"""Prometheus metrics (`blockdraft_*`), fed from requests and the engine's telemetry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    def __init__(self, max_al: int):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("blockdraft_requests", "Requests by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("blockdraft_request_latency_seconds", "End-to-end request latency",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("blockdraft_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.generated = Counter("blockdraft_generated_tokens", "Generated tokens", registry=r)
        self.acceptance = Histogram("blockdraft_acceptance_length", "Tokens committed per verify step",
                                    buckets=tuple(range(1, max_al + 2)), registry=r)
        self.position_acceptance = Gauge("blockdraft_position_acceptance_rate",
                                         "Acceptance rate of each draft slot", ["position"], registry=r)
        self.running = Gauge("blockdraft_requests_running", "Requests running", registry=r)
        self.waiting = Gauge("blockdraft_requests_waiting", "Requests waiting", registry=r)
        self.blocks_used = Gauge("blockdraft_cache_blocks_used", "Target KV blocks in use", registry=r)
        self.blocks_free = Gauge("blockdraft_cache_blocks_free", "Target KV blocks free", registry=r)
        self.mean_al = Gauge("blockdraft_mean_acceptance_length", "Mean acceptance length", registry=r)
        self.prefix_caching = Gauge("blockdraft_prefix_caching_enabled", "1 when prefix-cache hits are served; "
                                    "0 with the reason they are not", ["reason"], registry=r)

    def observe_prefix_caching(self, off: str | None) -> None:
        """`off`: why the engine serves no prefix hits (a hybrid target's recurrent state, ...), or None."""
        self.prefix_caching.labels(reason=off or "").set(0 if off else 1)

    def observe_engine(self, stats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.blocks_free.set(stats.blocks_free)
        self.blocks_used.set(stats.blocks_total - stats.blocks_free)
        self.mean_al.set(stats.spec.mean_acceptance_length)
        for i, rate in enumerate(stats.spec.per_position_acceptance()):
            self.position_acceptance.labels(position=str(i)).set(rate)
