#!/usr/bin/env bash
# A worker killed under steady load, in one command: `raygrid serve` with REPLICAS engine replicas of one GPU
# each on a local Ray cluster, `raygrid bench serve` at RATE requests/s for NUM requests (512 prompt and 128
# output tokens), and SIGKILL of replica 0's worker KILL_AT seconds into the run. Its requests migrate to the
# other replica (or, with one replica, wait for the rebuild). Writes bench.json (every request's send time,
# TTFT and ITLs), server.log, metrics.txt (/metrics after the run), and failure.json with failure.png
# (benchmarks/scripts/plot_failure.py: requests completed against sent, TTFT and ITL around the failure, and
# the time until the rebuilt replica served again).
#   [REPLICAS=2] [RATE=16] [NUM=1200] [KILL_AT=20] [MODEL=random-qwen3-0.6b] [DEVICE_ARGS=""] benchmarks/scripts/failure.sh OUT_DIR
set -uo pipefail
out=$1
mkdir -p "$out"
replicas=${REPLICAS:-2}
# The CLIs through their modules (the GPU machine has no console scripts on PATH).
RG=(python3 -c 'import sys; from raygrid.entrypoints.cli import main; sys.argv = ["raygrid"] + sys.argv[1:]; sys.exit(main())')
rg() { "${RG[@]}" "$@"; }
ray_cli() { python3 -c 'import sys; from ray.scripts.scripts import main; sys.argv = ["ray"] + sys.argv[1:]; main()' "$@"; }

ray_cli start --head --disable-usage-stats ${RAY_START_ARGS:-} > "$out/ray_start.log" 2>&1 || { cat "$out/ray_start.log"; exit 1; }
layout=(-dp "$replicas")
[ "$replicas" = 1 ] && layout=(--distributed-executor-backend ray)  # one replica, still on Ray: it is rebuilt
(exec "${RG[@]}" serve --model "${MODEL:-random-qwen3-0.6b}" "${layout[@]}" --ray-address auto --port 8011 --max-model-len 2048 \
  --max-queued-requests 1000000 --log-level warning ${DEVICE_ARGS:-}) > "$out/server.log" 2>&1 &
server=$!
until python3 -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8011/health').status_code != 200)" 2>/dev/null; do
  kill -0 $server 2>/dev/null || { echo "server exited"; tail -30 "$out/server.log"; ray_cli stop --force > /dev/null; exit 1; }; sleep 1; done
bench=(bench serve --base-url http://127.0.0.1:8011 --input-len 512 --output-len 128 --token-id-range 10 150000 --no-progress)
rg "${bench[@]}" --num-prompts 64 > /dev/null 2>&1  # warm-up
rg "${bench[@]}" --num-prompts "${NUM:-1200}" --request-rate "${RATE:-16}" --save-result "$out/bench.json" > "$out/bench.log" 2>&1 &
bench_pid=$!
sleep "${KILL_AT:-20}"
python3 - "$out" <<'PY'
import json, os, signal, sys, time
import ray
ray.init(address="auto", log_to_driver=False)
(name, namespace), = [(a["name"], a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)
                      if a["name"].startswith("raygrid-") and "-replica0-rank0" in a["name"]]
pid = ray.get(ray.get_actor(name, namespace=namespace).pid.remote())
os.kill(pid, signal.SIGKILL)
json.dump({"killed": name, "pid": pid, "unix_time": time.time()}, open(f"{sys.argv[1]}/kill.json", "w"))
print(f"SIGKILL {name} (pid {pid})")
PY
wait $bench_pid
cat "$out/bench.log"
python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8011/metrics').text)" > "$out/metrics.txt"
grep -E "^raygrid_(request_migrations|replica_rebuilds)_total|^raygrid_engine_replica_healthy" "$out/metrics.txt"
kill $server; wait $server
ray_cli stop --force > /dev/null 2>&1
python3 "$(dirname "$0")/plot_failure.py" "$out"
