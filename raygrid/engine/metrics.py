"""Prometheus metrics of one engine (prometheus-client), named like vLLM's with a ``raygrid:`` prefix.

Each engine gets its own registry, so several engines in one process (tests) do not collide. With several
API server processes (``PROMETHEUS_MULTIPROC_DIR`` set before prometheus-client is imported), each
process writes its values to files there and /metrics, whichever process answers it, sums the request
counters and histograms of all of them. The engine's own gauges and counters reach every API server;
only the one with ``observe_scheduler`` records them.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from raygrid.engine.scheduler import SchedulerStats

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class EngineMetrics:
    def __init__(self, model_name: str, observe_scheduler: bool = True) -> None:
        self.registry = CollectorRegistry()
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.observes_scheduler = observe_scheduler
        labels = ["model_name"]
        r = self.registry

        def histogram(name, doc):
            return Histogram(name, doc, labels, registry=r, buckets=_LATENCY_BUCKETS).labels(model_name)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def gauge(name, doc):  # set by one process: its latest value is the value
            return Gauge(name, doc, labels, registry=r, multiprocess_mode="mostrecent").labels(model_name)

        self.time_to_first_token = histogram("raygrid:time_to_first_token_seconds", "Time from arrival to the first output token.")
        self.inter_token_latency = histogram("raygrid:inter_token_latency_seconds", "Time between consecutive output tokens.")
        self.e2e_latency = histogram("raygrid:e2e_request_latency_seconds", "Time from arrival to the last output token.")
        self.queue_time = histogram("raygrid:request_queue_time_seconds", "Time a request waited before it first ran.")
        self.num_running = gauge("raygrid:num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("raygrid:num_requests_waiting", "Requests waiting to run.")
        self.kv_cache_usage = gauge("raygrid:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).")
        self.prefix_cache_queries = counter("raygrid:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("raygrid:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("raygrid:num_preemptions", "Requests preempted for lack of KV blocks.")
        self.prompt_tokens = counter("raygrid:prompt_tokens", "Prompt tokens of accepted requests.")
        self.generation_tokens = counter("raygrid:generation_tokens", "Output tokens generated.")
        self.requests_finished = Counter(
            "raygrid:request_success", "Finished requests by finish reason.", ["model_name", "finished_reason"], registry=r
        )
        self._model_name = model_name
        self._last = SchedulerStats()

    def observe_scheduler(self, stats: SchedulerStats) -> None:
        """Gauges take the new values; counters advance by what changed since the last call."""
        if not self.observes_scheduler:
            return
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        self.prefix_cache_queries.inc(stats.prefix_cache_queries - self._last.prefix_cache_queries)
        self.prefix_cache_hits.inc(stats.prefix_cache_hits - self._last.prefix_cache_hits)
        self.preemptions.inc(stats.num_preemptions - self._last.num_preemptions)
        self._last = stats

    def observe_finished(self, finish_reason: str) -> None:
        self.requests_finished.labels(self._model_name, finish_reason).inc()

    def render(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
