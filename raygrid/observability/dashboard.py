"""raygrid's Grafana dashboard, built as code with grafana-foundation-sdk from the metrics the server exports
(engine/metrics.py): latency percentiles, token throughput, the batch, the KV cache, prefix hits and
preemptions. ``export`` gives Grafana's dashboard JSON; ``push`` uploads it through grafana-client.

Every panel query names only metrics that ``/metrics`` serves (a test checks it against a live server)."""

from __future__ import annotations

import json
from dataclasses import dataclass

DASHBOARD_UID = "raygrid-overview"
DATASOURCE = "${datasource}"  # the dashboard's Prometheus, picked in Grafana


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    unit: str
    queries: tuple[Query, ...]


def _quantiles(metric: str, what: str) -> tuple[Query, ...]:
    return tuple(Query(f"histogram_quantile({q}, sum by (le, model_name) (rate({metric}_bucket[$__rate_interval])))",
                       f"{what} p{int(q * 100)} {{{{model_name}}}}") for q in (0.5, 0.9, 0.99))


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Time to first token", "s", _quantiles("raygrid:time_to_first_token_seconds", "TTFT")),
    PanelSpec("Inter-token latency", "s", _quantiles("raygrid:inter_token_latency_seconds", "ITL")),
    PanelSpec("End-to-end request latency", "s", _quantiles("raygrid:e2e_request_latency_seconds", "E2E")),
    PanelSpec("Queue time", "s", _quantiles("raygrid:request_queue_time_seconds", "queue")),
    PanelSpec("Token throughput", "suffix: tok/s", (  # Grafana's custom-suffix unit
        Query("sum by (model_name) (rate(raygrid:generation_tokens_total[$__rate_interval]))", "generated {{model_name}}"),
        Query("sum by (model_name) (rate(raygrid:prompt_tokens_total[$__rate_interval]))", "prompt {{model_name}}"),
    )),
    PanelSpec("Requests", "short", (
        Query("sum by (model_name) (raygrid:num_requests_running)", "running {{model_name}}"),
        Query("sum by (model_name) (raygrid:num_requests_waiting)", "waiting {{model_name}}"),
        Query("sum by (model_name, finished_reason) (rate(raygrid:request_success_total[$__rate_interval]))",
              "finished ({{finished_reason}}) per s"),
    )),
    PanelSpec("KV cache usage", "percentunit", (
        Query("max by (model_name) (raygrid:kv_cache_usage_perc)", "{{model_name}}"),
    )),
    PanelSpec("Prefix cache hit rate", "percentunit", (
        Query("sum by (model_name) (rate(raygrid:prefix_cache_hits_total[$__rate_interval])) / "
              "sum by (model_name) (rate(raygrid:prefix_cache_queries_total[$__rate_interval]))", "{{model_name}}"),
    )),
    PanelSpec("Preemptions", "short", (
        Query("sum by (model_name) (rate(raygrid:num_preemptions_total[$__rate_interval]))", "per s {{model_name}}"),
    )),
)


def build_dashboard():
    """The dashboard as grafana-foundation-sdk's model: a Prometheus datasource variable, then the panels two
    abreast."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

    board = (dashboard.Dashboard("raygrid")
             .uid(DASHBOARD_UID)
             .tags(["raygrid", "llm"])
             .time("now-1h", "now")
             .refresh("10s")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    source = DataSourceRef(type_val="prometheus", uid=DATASOURCE)
    for n, spec in enumerate(PANELS):
        panel = (timeseries.Panel().title(spec.title).unit(spec.unit).datasource(source)
                 .grid_pos(GridPos(h=8, w=12, x=12 * (n % 2), y=8 * (n // 2))))
        for i, query in enumerate(spec.queries):
            panel = panel.with_target(prometheus.Dataquery().expr(query.expr).legend_format(query.legend)
                                      .ref_id(chr(ord("A") + i)).datasource(source))
        board = board.with_panel(panel)
    return board.build()


def export_json() -> dict:
    """Grafana's dashboard JSON (the ``dashboard`` object of its HTTP API)."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(json.dumps(build_dashboard(), cls=JSONEncoder))


def push(grafana_url: str, api_key: str | None = None, folder_uid: str | None = None, timeout_s: float = 10.0) -> dict:
    """Create or replace the dashboard on a Grafana server (its dashboard API, through grafana-client); returns
    Grafana's answer (uid, url, version)."""
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaException, TokenAuth

    api = GrafanaApi.from_url(grafana_url, credential=TokenAuth(api_key) if api_key else None, timeout=timeout_s)
    body = {"dashboard": export_json(), "overwrite": True, "message": "raygrid dashboards push"}
    if folder_uid:
        body["folderUid"] = folder_uid
    try:
        return api.dashboard.update_dashboard(body)
    except GrafanaException as error:  # one line for the command's user: what Grafana said, and where
        raise ValueError(f"--grafana-url {grafana_url}: Grafana answered {error.status_code} ({error.message})") from None
    except OSError as error:
        raise ValueError(f"--grafana-url {grafana_url}: {type(error).__name__}: {error}") from None


def metric_names() -> set[str]:
    """The series names the panel queries read."""
    import re

    names = set()
    for spec in PANELS:
        for query in spec.queries:
            names.update(re.findall(r"raygrid:[a-z0-9_]+", query.expr))
    return names
