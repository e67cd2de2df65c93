"""raygrid's Grafana dashboard: every series its panels query is served by a live `raygrid serve`'s /metrics, and
`raygrid dashboards push` makes the request Grafana's dashboard API requires. No Grafana server installs here:
the push goes to a small local HTTP server that checks that request (path, method, token, JSON body with the
dashboard's uid and title, overwrite) and answers as Grafana does."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk is a dependency of raygrid's dashboards")

from raygrid.observability.dashboard import DASHBOARD_UID, PANELS, export_json, metric_names  # noqa: E402


def test_every_panel_query_reads_series_the_server_exports(qwen3_dir):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.test_openai_server import start_server, stop_server

    board = export_json()
    assert board["uid"] == DASHBOARD_UID and len(board["panels"]) == len(PANELS)
    assert all(p["targets"] and all(t["expr"] and t["datasource"]["uid"] == "${datasource}" for t in p["targets"]) for p in board["panels"])
    assert {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in board["panels"]} == {(12 * (n % 2), 8 * (n // 2)) for n in range(len(PANELS))}
    proc, base = start_server(qwen3_dir)
    try:
        for _ in range(2):  # a finished request, so that every histogram and labelled counter has a series
            assert httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 3}, timeout=30).status_code == 200
        text = httpx.get(f"{base}/metrics", timeout=10).text
    finally:
        stop_server(proc)
    served = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    assert metric_names() <= served, sorted(metric_names() - served)


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
