"""`ray job submit` runs of the cluster benchmark: a real job server (the session cluster's dashboard), a job
with a working directory, and the report it writes (JSON, PNG plots, a Markdown summary)."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest
import yaml
from matplotlib.image import imread
from ray.job_submission import JobStatus, JobSubmissionClient

from tests.conftest import RAY_DASHBOARD_PORT, free_port


def test_cluster_benchmark_job_writes_its_report(ray_cluster, qwen3_dir, tmp_path):
    job_dir, out = tmp_path / "job", tmp_path / "report"
    job_dir.mkdir()
    sweep = {"model": qwen3_dir, "engine_kwargs": {"device": "cpu", "dtype": "float32", "max_model_len": 256},
             # One layout (DP=2: two ranks to report, two Serve replicas): a second layout cost a minute of the
             # suite, and the loop over layouts is the same code.
             "layouts": ["1x1x2"],
             "offline": {"num_prompts": 8, "input_len": 32, "output_len": 8},
             "online": {"num_prompts": 6, "input_len": 32, "output_len": 8, "request_rates": [4, float("inf")]},
             "http_port": free_port()}
    (job_dir / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    client = JobSubmissionClient(f"http://127.0.0.1:{RAY_DASHBOARD_PORT}")
    # As users submit it: `ray job submit --working-dir . -- raygrid bench cluster --config sweep.yaml` (the command
    # through this interpreter: the test's environment may not have its scripts on PATH).
    job = client.submit_job(entrypoint=f"{sys.executable} -m raygrid.entrypoints.cli bench cluster --config sweep.yaml --output-dir {out}",
                            runtime_env={"working_dir": str(job_dir)})
    deadline = time.monotonic() + 300
    while (status := client.get_job_status(job)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.monotonic() < deadline, f"the job did not finish in 300 s:\n{client.get_job_logs(job)[-3000:]}"
        time.sleep(2)
    logs = client.get_job_logs(job)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    assert "raygrid bench cluster: wrote" in logs

    report = json.loads((out / "report.json").read_text())
    assert [entry["layout"] for entry in report["layouts"]] == ["1x1x2"]
    for entry in report["layouts"]:
        offline = entry["offline"]
        assert offline["output_tokens"] == 8 * 8 and offline["output_throughput"] > 0
        assert len(offline["ranks"]) == entry["dp"] and all(r["num_steps"] > 0 and r["mean_execute_s"] > 0 for r in offline["ranks"])
        assert [r["request_rate"] for r in entry["online"]] == [4, float("inf")]
        assert all(r["completed"] == 6 and r["failed"] == 0 and r["p50_ttft_ms"] > 0 for r in entry["online"])
    for name in ("throughput_by_layout.png", "latency_by_rate.png", "step_time_by_rank.png"):
        pixels = imread(out / name)
        assert pixels.shape[0] > 100 and np.std(pixels) > 0.01, f"{name} is blank"
    summary = (out / "summary.md").read_text()
    assert all(f"]({name})" in summary for name in ("throughput_by_layout.png", "latency_by_rate.png", "step_time_by_rank.png"))
    assert f"| 1x1x2 | {report['layouts'][0]['offline']['output_throughput']:.1f} |" in summary


def test_cluster_config_errors_name_the_field(tmp_path):
    from raygrid.bench.cluster import load_config

    for bad, message in (({"layouts": ["2x2"]}, "'2x2' is not TPxPPxDP"),
                         ({"layouts": ["1x1x1"], "engine_kwargs": {"tensor_parallel_size": 2}}, "engine_kwargs.tensor_parallel_size"),
                         ({"layouts": ["1x1x1"], "offline": {"num_prompt": 3}}, "num_prompt")):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump({"model": "m", **bad}))
        with pytest.raises(ValueError, match=message):
            load_config(str(path))
    with pytest.raises(ValueError, match="--config .*missing.yaml: No such file"):
        load_config(str(tmp_path / "missing.yaml"))
