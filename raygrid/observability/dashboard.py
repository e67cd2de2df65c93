"""raygrid's Grafana dashboard, built as code with grafana-foundation-sdk from the metrics the server exports
(engine/metrics.py): latency percentiles, token throughput, the batch, the KV cache, prefix hits,
preemptions, the engine replicas in service with request migrations and rebuilds and, under expert parallelism with EPLB, the experts' balancedness. ``export`` gives Grafana's dashboard JSON; ``push`` uploads it through grafana-client.

Every panel query names only metrics that ``/metrics`` serves (a test checks it against a live server)."""

from __future__ import annotations

import json
from dataclasses import dataclass

DASHBOARD_UID = "raygrid-overview"
DATASOURCE = "${datasource}"  # the dashboard's Prometheus, picked in Grafana
# The metric names' start, picked in Grafana: "raygrid_" as `raygrid serve` exports them, "ray_raygrid_" as Ray's
# metrics endpoint does for the Serve application (engine/metrics.py).
PREFIX = "${prefix}"
PREFIXES = {"raygrid serve": "raygrid_", "Ray Serve": "ray_raygrid_"}


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    unit: str
    queries: tuple[Query, ...]
    # The engine feature without which its series do not exist; "replica_failures": counters that Ray's exporter
    # (which cannot add 0) shows only from the first failure on.
    only_with: str | None = None


def _quantiles(metric: str, what: str) -> tuple[Query, ...]:
    return tuple(Query(f"histogram_quantile({q}, sum by (le, model_name) (rate({metric}_bucket[$__rate_interval])))",
                       f"{what} p{int(q * 100)} {{{{model_name}}}}") for q in (0.5, 0.9, 0.99))


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Time to first token", "s", _quantiles(f"{PREFIX}time_to_first_token_seconds", "TTFT")),
    PanelSpec("Inter-token latency", "s", _quantiles(f"{PREFIX}inter_token_latency_seconds", "ITL")),
    PanelSpec("End-to-end request latency", "s", _quantiles(f"{PREFIX}e2e_request_latency_seconds", "E2E")),
    PanelSpec("Queue time", "s", _quantiles(f"{PREFIX}request_queue_time_seconds", "queue")),
    PanelSpec("Token throughput", "suffix: tok/s", (  # Grafana's custom-suffix unit
        Query(f"sum by (model_name) (rate({PREFIX}generation_tokens_total[$__rate_interval]))", "generated {{model_name}}"),
        Query(f"sum by (model_name) (rate({PREFIX}prompt_tokens_total[$__rate_interval]))", "prompt {{model_name}}"),
    )),
    PanelSpec("Requests", "short", (
        Query(f"sum by (model_name) ({PREFIX}num_requests_running)", "running {{model_name}}"),
        Query(f"sum by (model_name) ({PREFIX}num_requests_waiting)", "waiting {{model_name}}"),
        Query(f"sum by (model_name, finished_reason) (rate({PREFIX}request_success_total[$__rate_interval]))",
              "finished ({{finished_reason}}) per s"),
    )),
    PanelSpec("KV cache usage", "percentunit", (
        Query(f"max by (model_name) ({PREFIX}kv_cache_usage_perc)", "{{model_name}}"),
    )),
    PanelSpec("Prefix cache hit rate", "percentunit", (
        Query(f"sum by (model_name) (rate({PREFIX}prefix_cache_hits_total[$__rate_interval])) / "
              f"sum by (model_name) (rate({PREFIX}prefix_cache_queries_total[$__rate_interval]))", "{{model_name}}"),
    )),
    PanelSpec("Engine step time by replica", "s", (
        # raygrid serve labels its data-parallel replicas engine_replica; Serve adds its own replica label.
        Query(f"max by (model_name, engine_replica, replica) ({PREFIX}engine_step_seconds)",
              "{{model_name}} {{replica}}{{engine_replica}}"),
    )),
    PanelSpec("Preemptions", "short", (
        Query(f"sum by (model_name) (rate({PREFIX}num_preemptions_total[$__rate_interval]))", "per s {{model_name}}"),
    )),
    PanelSpec("Engine replicas in service", "short", (
        Query(f"sum by (model_name) ({PREFIX}engine_replica_healthy)", "{{model_name}}"),
    )),
    PanelSpec("Request migrations and replica rebuilds", "short", (
        Query(f"sum by (model_name) (increase({PREFIX}request_migrations_total[$__rate_interval]))",
              "requests migrated {{model_name}}"),
        Query(f"sum by (model_name) (increase({PREFIX}replica_rebuilds_total[$__rate_interval]))", "rebuilt {{model_name}}"),
    ), only_with="replica_failures"),
    PanelSpec("Expert balancedness (EPLB)", "percentunit", (
        # Mean over max tokens per EP rank over the last rebalance's window.
        Query(f"min by (model_name) ({PREFIX}expert_balancedness)", "{{model_name}}"),
    ), only_with="enable_eplb"),
)


def build_dashboard():
    """The dashboard as grafana-foundation-sdk's model: a Prometheus datasource variable, then the panels two
    abreast."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos, VariableOption

    board = (dashboard.Dashboard("raygrid")
             .uid(DASHBOARD_UID)
             .tags(["raygrid", "llm"])
             .time("now-1h", "now")
             .refresh("10s")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
             .with_variable(dashboard.CustomVariable("prefix").label("Exported by")
                            .values(", ".join(f"{name} : {value}" for name, value in PREFIXES.items()))
                            .current(VariableOption(text=next(iter(PREFIXES)), value=next(iter(PREFIXES.values()))))))
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


def metric_names(prefix: str = PREFIXES["raygrid serve"],
                 features: frozenset[str] = frozenset({"enable_eplb", "replica_failures"})) -> set[str]:
    """The series names the panel queries read, with the names starting as ``prefix`` (one of PREFIXES), for an
    engine with ``features`` (the panels of other features are left out)."""
    import re

    names = set()
    for spec in PANELS:
        if spec.only_with is not None and spec.only_with not in features:
            continue
        for query in spec.queries:
            names.update(prefix + rest for rest in re.findall(re.escape(PREFIX) + r"([a-z0-9_]+)", query.expr))
    return names
