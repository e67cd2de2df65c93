#!/usr/bin/env bash
# Offline and online throughput of one workload (N requests of 512 prompt and 128 output tokens) in one
# command: offline `bench throughput` (detokenizing, as a server must), then `raygrid serve` in each MODES
# entry ("process": the engine core in its own process; "inprocess": on a thread of the API process; "apiK":
# K API server processes, --api-server-count K), driven by CLIENTS `bench serve` processes that together
# send all N requests at once, while /health is probed.
#   [MODES="process inprocess api2"] [CLIENTS=1] benchmarks/scripts/online_vs_offline.sh OUT_DIR [N]
# MODEL, DTYPE, EXTRA (more engine flags) and MAX_ID (prompt ids below it) adapt it to other models.
# PROFILE=1 records the server's processes with py-spy during the load (py-spy_MODE.txt, collapsed stacks);
# SERVER_DIR runs the server from another checkout's root (a before/after pair); OFFLINE=0 skips offline.
set -uo pipefail
out=$1; n=${2:-2000}; clients=${CLIENTS:-1}
rg() { python3 -m raygrid.entrypoints.cli "$@"; }
common=(--model "${MODEL:-random-qwen3-0.6b}" --dtype "${DTYPE:-bfloat16}" ${EXTRA:-})
if [ "${OFFLINE:-1}" = 1 ]; then
  rg bench throughput "${common[@]}" --num-prompts "$n" --input-len 512 --output-len 128 --detokenize --no-progress \
    --output-json "$out/offline.json" > "$out/offline.log" 2>&1
  tail -1 "$out/offline.log"
fi
for mode in ${MODES:-process inprocess}; do
  flag=()
  case $mode in inprocess) flag=(--engine-in-process) ;; api*) flag=(--api-server-count "${mode#api}") ;; esac
  # python -m puts the working directory first on sys.path: the server runs the code of SERVER_DIR
  (cd "${SERVER_DIR:-.}" && exec python3 -m raygrid.entrypoints.cli serve "${common[@]}" --port 8000 \
    --max-queued-requests 1000000 --log-level warning "${flag[@]}") > "$out/server_$mode.log" 2>&1 &
  server=$!
  until python3 -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8000/health').status_code != 200)" 2>/dev/null; do sleep 1; done
  bench=(bench serve --base-url http://127.0.0.1:8000 --input-len 512 --output-len 128 --token-id-range 10 "${MAX_ID:-150000}" --no-progress)
  rg "${bench[@]}" --num-prompts 64 > /dev/null 2>&1   # warm-up: kernels compiled, allocator grown
  python3 benchmarks/scripts/health_probe.py http://127.0.0.1:8000 "$out/health_$mode.json" & probe=$!
  spy=
  if [ "${PROFILE:-0}" = 1 ]; then
    py-spy record --pid "$server" --subprocesses --nonblocking --rate 200 --format raw -o "$out/py-spy_$mode.txt" \
      > "$out/py-spy_$mode.log" 2>&1 & spy=$!
    sleep 1
  fi
  pids=()
  for c in $(seq 1 "$clients"); do
    rg "${bench[@]}" --num-prompts $((n / clients)) --seed "$c" --save-result "$out/online_${mode}_c$c.json" > "$out/online_${mode}_c$c.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  kill $probe; wait $probe
  [ -n "$spy" ] && { kill -INT $spy; wait $spy; }
  echo "== $mode, $clients client(s)"
  python3 - "$out" "$mode" "$clients" <<'PY'
import json, sys
out, mode, clients = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = [json.load(open(f"{out}/online_{mode}_c{c}.json")) for c in range(1, clients + 1)]
tokens = sum(r["total_output_tokens"] for r in runs)
duration = max(r["duration"] for r in runs)  # all started together
summary = {"mode": mode, "clients": clients, "completed": sum(r["completed"] for r in runs), "failed": sum(r["failed"] for r in runs),
           "output_throughput": tokens / duration, "duration": duration,
           "median_ttft_ms": [r["median_ttft_ms"] for r in runs], "median_tpot_ms": [r["median_tpot_ms"] for r in runs]}
json.dump(summary, open(f"{out}/online_{mode}.json", "w"), indent=2)
print(json.dumps(summary))
PY
  cat "$out/health_$mode.json"
  kill $server 2>/dev/null; wait $server
done
