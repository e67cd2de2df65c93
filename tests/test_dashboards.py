"""raygrid's Grafana dashboard: every series its panels query is served by a live `raygrid serve`'s /metrics, a real
Prometheus scraping it (ray_configs/prometheus.yml) answers every panel's query with data, and
`raygrid dashboards push` makes the request Grafana's dashboard API requires. No Grafana server installs here:
the push goes to a small local HTTP server that checks that request (path, method, token, JSON body with the
dashboard's uid and title, overwrite) and answers as Grafana does."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk is a dependency of raygrid's dashboards")

from raygrid.observability.dashboard import DASHBOARD_UID, PANELS, PREFIX, PREFIXES, export_json, metric_names  # noqa: E402
from tests.conftest import free_port  # noqa: E402


def test_every_panel_query_reads_series_the_server_exports(qwen3_moe_dir, tmp_path):
    """Every series the panels read is on a live server's /metrics, and a real Prometheus scraping it with
    ray_configs/prometheus.yml answers every panel's query with data. The server runs the MoE model with EPLB
    (an EP group of one rank, rebalancing every 2 steps), so that the balancedness panel has data too."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.test_openai_server import start_server, stop_server

    board = export_json()
    assert board["uid"] == DASHBOARD_UID and len(board["panels"]) == len(PANELS)
    assert all(p["targets"] and all(t["expr"] and t["datasource"]["uid"] == "${datasource}" for t in p["targets"]) for p in board["panels"])
    assert {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in board["panels"]} == {(12 * (n % 2), 8 * (n // 2)) for n in range(len(PANELS))}
    proc, base = start_server(qwen3_moe_dir, "--enable-expert-parallel", "--enable-eplb",
                              "--eplb-config", '{"num_redundant_experts": 2, "step_interval": 2, "window_size": 4}')
    prometheus = None
    try:
        prometheus, prometheus_url = start_prometheus(base, tmp_path)
        for _ in range(4):  # finished requests, so that every histogram and labelled counter has a series
            assert httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 3}, timeout=30).status_code == 200
            time.sleep(1)
        queries = [query.expr.replace(PREFIX, PREFIXES["raygrid serve"]).replace("$__rate_interval", "30s")
                   for spec in PANELS for query in spec.queries]
        deadline, empty = time.monotonic() + 60, queries  # the step-time gauge is read every 5 s
        while empty and time.monotonic() < deadline:
            time.sleep(1)
            empty = [q for q in queries if not prometheus_query(prometheus_url, q)]
        assert not empty, f"Prometheus found no data for: {empty}"
        text = httpx.get(f"{base}/metrics", timeout=10).text
        served = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
        assert metric_names() <= served, sorted(metric_names() - served)
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        stop_server(proc)


def start_prometheus(target: str, tmp_path) -> tuple[subprocess.Popen, str]:
    """A real Prometheus (Debian's, which .ci/run installs) with ray_configs/prometheus.yml, pointed at ``target``
    and scraping every second."""
    config = yaml.safe_load((Path(__file__).parent.parent / "ray_configs" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "raygrid"]
    job["static_configs"][0]["targets"] = [target.removeprefix("http://")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    subprocess.run(["promtool", "check", "config", str(path)], check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "Prometheus did not start"
        time.sleep(0.5)


def prometheus_query(url: str, expr: str) -> list:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


class FakeGrafana(BaseHTTPRequestHandler):
    """Grafana's POST /api/dashboards/db as its HTTP API documents it."""

    token = "glsa_test_token"
    received: list[dict] = []

    def do_POST(self):  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._answer(401, {"message": "Unauthorized"})
        if self.path != "/api/dashboards/db" or not self.headers.get("Content-Type", "").startswith("application/json"):
            return self._answer(404, {"message": "Not found"})
        payload = json.loads(body)
        dashboard = payload.get("dashboard") or {}
        if not dashboard.get("title") or not isinstance(payload.get("overwrite"), bool) or "id" in dashboard and dashboard["id"] is not None:
            return self._answer(400, {"message": "bad dashboard"})
        FakeGrafana.received.append(payload)
        uid = dashboard.get("uid")
        self._answer(200, {"id": 1, "uid": uid, "url": f"/d/{uid}/raygrid", "status": "success", "version": len(FakeGrafana.received)})

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


def test_push_makes_the_request_grafanas_api_requires():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeGrafana)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    cli = [sys.executable, "-m", "raygrid.entrypoints.cli", "dashboards", "push", "--grafana-url", url]
    try:
        FakeGrafana.received.clear()
        done = subprocess.run([*cli, "--api-key", FakeGrafana.token, "--folder-uid", "llm"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"dashboard {DASHBOARD_UID} pushed (version 1): /d/{DASHBOARD_UID}/raygrid" in done.stdout
        (payload,) = FakeGrafana.received
        assert payload["dashboard"] == export_json() and payload["overwrite"] is True and payload["folderUid"] == "llm"
        # A wrong token: Grafana's 401 becomes a one-line error and a failing exit.
        refused = subprocess.run([*cli, "--api-key", "wrong"], capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "401" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert len(FakeGrafana.received) == 1
    finally:
        server.shutdown()
        server.server_close()
