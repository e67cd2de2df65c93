"""RayExporter: raygrid's metrics through ``ray.serve.metrics`` (engine/metrics.py's EngineMetrics takes it).

Inside a Serve replica these carry the deployment, replica and application as labels; Ray's metrics
endpoint on each node exports them as ``ray_raygrid_*``. Nothing is rendered here: /metrics of the Serve
application says where to scrape instead.
"""

from __future__ import annotations

from ray.serve import metrics

from raygrid.engine.metrics import LATENCY_BUCKETS


class RaySeries:
    def __init__(self, metric, tags: dict[str, str] | None = None) -> None:
        self._metric, self._tags = metric, tags

    def inc(self, value: float = 1.0) -> None:
        if value:
            self._metric.inc(value, tags=self._tags)

    def set(self, value: float) -> None:
        self._metric.set(value, tags=self._tags)

    def observe(self, value: float) -> None:
        self._metric.observe(value, tags=self._tags)

    def labels(self, **more: str) -> "RaySeries":
        return RaySeries(self._metric, {**(self._tags or {}), **more})


class RayExporter:
    name = "ray"

    def make(self, kind: str, name: str, doc: str, tags: dict[str, str], extra: tuple[str, ...] = ()) -> RaySeries:
        keys = tuple(tags) + extra
        if kind == "histogram":
            metric = metrics.Histogram(name, doc, boundaries=list(LATENCY_BUCKETS), tag_keys=keys)
        elif kind == "counter":
            metric = metrics.Counter(name, doc, tag_keys=keys)
        else:
            metric = metrics.Gauge(name, doc, tag_keys=keys)
        metric.set_default_tags(dict(tags))  # a copy: Serve adds its labels to the dict it is given
        return RaySeries(metric)

    def render(self) -> None:
        return None
