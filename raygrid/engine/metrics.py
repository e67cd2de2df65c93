"""The engine's metrics, named like vLLM's with a ``raygrid_`` prefix, through one of two exporters.

- ``PrometheusExporter`` (``raygrid serve``, the default): prometheus-client, a registry per engine (several engines in one
  process do not collide) and the server's /metrics. With several API server processes
  (``PROMETHEUS_MULTIPROC_DIR`` set before prometheus-client is imported) each process writes its values to
  files there and /metrics, whichever process answers, sums the request counters and histograms of all.
- ``RayExporter`` (serve/ray_metrics.py, the Ray Serve application): ``ray.serve.metrics``, which Ray's metrics endpoint on each node
  exports with the deployment, replica and application as labels. Ray adds its own prefix, so
  ``raygrid_time_to_first_token_seconds`` here is ``ray_raygrid_time_to_first_token_seconds`` there; the
  names carry no colons (Ray refuses them), and the dashboard's ``prefix`` variable picks either.

The scheduler's gauges and counters are recorded by one party only (``observe_scheduler``): the API server
that owns the engine, or under Serve each engine replica, for itself.
"""

from __future__ import annotations

import functools
import os

from raygrid.engine.scheduler import SchedulerStats

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
PREFIX = "raygrid_"
RAY_PREFIX = "ray_"  # what Ray's metrics endpoint puts before every exported name


class PrometheusSeries:
    """One prometheus-client metric with its labels bound: ``inc``, ``set``, ``observe``; ``labels(**more)``
    binds a further label (the finish reason). Ray's counterpart is serve/ray_metrics.py's RaySeries."""

    def __init__(self, metric, tags: dict[str, str]) -> None:
        self._metric, self._tags = metric, tags
        # Bound once when every label has its value (the hot paths); a metric with a further label is bound by labels().
        self._bound = metric.labels(**tags) if len(tags) == len(metric._labelnames) else None

    def inc(self, value: float = 1.0) -> None:
        if value:
            self._bound.inc(value)

    def set(self, value: float) -> None:
        self._bound.set(value)

    def observe(self, value: float) -> None:
        self._bound.observe(value)

    def labels(self, **more: str) -> "PrometheusSeries":
        return PrometheusSeries(self._metric, {**self._tags, **more})


class PrometheusExporter:
    """Metrics in a registry of their own, rendered by the server's /metrics."""

    name = "prometheus"

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()

    def make(self, kind: str, name: str, doc: str, tags: dict[str, str], extra: tuple[str, ...] = ()) -> PrometheusSeries:
        from prometheus_client import Counter, Gauge, Histogram

        labels = tuple(tags) + extra
        if kind == "histogram":
            metric = Histogram(name, doc, labels, registry=self.registry, buckets=LATENCY_BUCKETS)
        elif kind == "counter":
            metric = Counter(name, doc, labels, registry=self.registry)
        else:  # set by one process: its latest value is the value
            metric = Gauge(name, doc, labels, registry=self.registry, multiprocess_mode="mostrecent")
        return PrometheusSeries(metric, tags)

    def render(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


class EngineMetrics:
    def __init__(self, model_name: str, observe_scheduler: bool = True, exporter=None) -> None:
        """``exporter``: a PrometheusExporter (the default) or serve/ray_metrics.py's RayExporter."""
        self.exporter = exporter or PrometheusExporter()
        self.observes_scheduler = observe_scheduler
        tags = {"model_name": model_name}

        def metric(kind: str, name: str, doc: str, extra: tuple[str, ...] = ()):
            """``kind`` histogram, counter or gauge; ``extra``: labels bound later (``labels(...)``)."""
            return self.exporter.make(kind, PREFIX + name, doc, tags, extra)

        histogram, counter, gauge = (functools.partial(metric, kind) for kind in ("histogram", "counter", "gauge"))
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time from arrival to the first output token.")
        self.inter_token_latency = histogram("inter_token_latency_seconds", "Time between consecutive output tokens.")
        self.e2e_latency = histogram("e2e_request_latency_seconds", "Time from arrival to the last output token.")
        self.queue_time = histogram("request_queue_time_seconds", "Time a request waited before it first ran.")
        self.num_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("num_requests_waiting", "Requests waiting to run.")
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).")
        self.prefix_cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("num_preemptions", "Requests preempted for lack of KV blocks.")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of accepted requests.")
        self.generation_tokens = counter("generation_tokens", "Output tokens generated.")
        self.requests_finished = counter("request_success", "Finished requests by finish reason.", ("finished_reason",))
        self.step_seconds = gauge("engine_step_seconds", "Mean wall time of an engine step since the last reading, by engine replica.",
                                  ("engine_replica",))
        self.expert_balancedness = gauge("expert_balancedness", "Expert parallelism with EPLB: mean over max tokens per EP rank "
                                         "over the last rebalance's window (1 is even).")
        self.eplb_rebalances = counter("eplb_rebalances", "EPLB rebalances of the experts.")
        self.request_migrations = counter("request_migrations", "Requests moved to another engine replica after theirs failed.")
        self.replica_rebuilds = counter("replica_rebuilds", "Failed engine replicas started again and back in service.")
        self.replica_healthy = gauge("engine_replica_healthy", "1 while an engine replica is in service, 0 while it is "
                                     "failed or being rebuilt.", ("engine_replica",))
        self._last = SchedulerStats()
        self._last_timing: dict[int, tuple[float, float]] = {}  # engine replica -> (steps, seconds in them)

    def observe_scheduler(self, stats: SchedulerStats) -> None:
        """Gauges take the new values; counters advance by what grew since the last call (never back: an engine
        whose totals drop, as an engine process that restarted, is counted from its new values on)."""
        last, self._last = self._last, stats

        def grown(name: str) -> int:
            return max(getattr(stats, name) - getattr(last, name), 0)

        # The front end's own counters (the engine client's migrations and rebuilds) are always this front end's.
        self.request_migrations.inc(grown("request_migrations"))
        self.replica_rebuilds.inc(grown("replica_rebuilds"))
        if not self.observes_scheduler:
            return

        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        self.prefix_cache_queries.inc(grown("prefix_cache_queries"))
        self.prefix_cache_hits.inc(grown("prefix_cache_hits"))
        self.preemptions.inc(grown("num_preemptions"))
        if stats.eplb_rebalances:
            self.expert_balancedness.set(stats.expert_balancedness)
            self.eplb_rebalances.inc(grown("eplb_rebalances"))

    def observe_replicas(self, healthy: list[bool]) -> None:
        """Each engine replica's health (the engine client's ``healthy``)."""
        if not self.observes_scheduler:
            return
        for replica, ok in enumerate(healthy):
            self.replica_healthy.labels(engine_replica=str(replica)).set(1.0 if ok else 0.0)

    def observe_step_timing(self, timings: list[dict[str, float]]) -> None:
        """Each engine replica's mean step time over the steps since the last call (``step_timing()``'s readings)."""
        if not self.observes_scheduler:
            return
        for replica, timing in enumerate(timings):
            steps, seconds = timing["num_steps"], timing["engine_step_s"] * timing["num_steps"]
            last_steps, last_seconds = self._last_timing.get(replica, (0, 0.0))
            if steps > last_steps:
                self.step_seconds.labels(engine_replica=str(replica)).set((seconds - last_seconds) / (steps - last_steps))
            self._last_timing[replica] = (steps, seconds)

    def observe_finished(self, finish_reason: str) -> None:
        self.requests_finished.labels(finished_reason=finish_reason).inc()

    def render(self) -> bytes | None:
        """The Prometheus text of these metrics; None when Ray's metrics endpoint exports them."""
        return self.exporter.render()
