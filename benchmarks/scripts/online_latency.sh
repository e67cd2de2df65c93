#!/usr/bin/env bash
# Serving latency in one command: the offline decode step with 256 running (bench throughput's decode
# profile), then `raygrid serve` (API_SERVERS API server processes) under a steady 8 requests/s, with 256
# requests sent at once (after their prefills, 256 decode together: the offline step's batch), and with
# 256 kept in flight (each finished request replaced, so prefills share the steps), 512 prompt and 128
# output tokens each. The targets of issue 11: TTFT median <= 30 ms and TPOT median <= 3 ms at 8 req/s;
# TPOT median at 256 in flight <= 1.3x the offline step.
# The 256-request runs are split over CLIENTS bench processes (one Python client cannot read 256 streams at
# engine speed, and its lag would count as TPOT); the summary takes the median of their medians.
#   [API_SERVERS=1] [CLIENTS=4] benchmarks/scripts/online_latency.sh OUT_DIR
set -uo pipefail
out=$1
rg() { python3 -m raygrid.entrypoints.cli "$@"; }
common=(--model "${MODEL:-random-qwen3-0.6b}" --dtype "${DTYPE:-bfloat16}" ${EXTRA:-})
rg bench throughput "${common[@]}" --num-prompts 256 --input-len 512 --output-len 128 --no-progress \
  --profile-dir "$out" --output-json "$out/offline_256.json" > "$out/offline_256.log" 2>&1
grep "decode step with 256" "$out/offline_256.log"
# exec: $! is the server itself (with rg, a shell function, it would be a subshell that kill leaves orphaned)
(exec python3 -m raygrid.entrypoints.cli serve "${common[@]}" --port 8000 --max-queued-requests 1000000 \
  --log-level warning --api-server-count "${API_SERVERS:-1}") > "$out/server.log" 2>&1 &
server=$!
until python3 -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8000/health').status_code != 200)" 2>/dev/null; do sleep 1; done
bench=(bench serve --base-url http://127.0.0.1:8000 --input-len 512 --output-len 128 --token-id-range 10 150000 --no-progress)
rg "${bench[@]}" --num-prompts 64 > /dev/null 2>&1   # warm-up
rg "${bench[@]}" --num-prompts 240 --request-rate 8 --goodput ttft:30 tpot:3 --save-result "$out/rate8.json" > "$out/rate8.log" 2>&1
echo "== 8 req/s"; cat "$out/rate8.log"
clients=${CLIENTS:-4}
split() {  # NAME TOTAL_PROMPTS [bench flags]: TOTAL over the clients, all started together
  local name=$1 total=$2; shift 2; local pids=()
  for c in $(seq 1 "$clients"); do
    rg "${bench[@]}" --num-prompts $((total / clients)) --seed "$c" "$@" --save-result "$out/${name}_c$c.json" \
      > "$out/${name}_c$c.log" 2>&1 & pids+=($!)
  done
  wait "${pids[@]}"
}
split burst256 256
split c256 1024 --max-concurrency $((256 / clients))
python3 - "$out" "$clients" <<'PY'
import json, statistics, sys
out = sys.argv[1]
step = json.load(open(f"{out}/profile_decode_256x512.json"))["wall_ms_per_step"]
def medians(name):
    runs = [json.load(open(f"{out}/{name}_c{c}.json")) for c in range(1, int(sys.argv[2]) + 1)]
    return statistics.median(r["median_tpot_ms"] for r in runs), [r["median_tpot_ms"] for r in runs]
rate8 = json.load(open(f"{out}/rate8.json"))
(burst, burst_each), (c256, c256_each) = medians("burst256"), medians("c256")
summary = {"offline_decode_step_256_ms": step, "rate8_median_ttft_ms": rate8["median_ttft_ms"],
           "rate8_median_tpot_ms": rate8["median_tpot_ms"],
           "burst256_median_tpot_ms": burst, "burst256_client_medians": burst_each, "burst256_tpot_over_step": burst / step,
           "c256_median_tpot_ms": c256, "c256_client_medians": c256_each, "c256_tpot_over_step": c256 / step}
json.dump(summary, open(f"{out}/latency_summary.json", "w"), indent=2)
print(json.dumps(summary))
PY
kill $server; wait $server
