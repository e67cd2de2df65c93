#!/usr/bin/env bash
# Serving latency in one command: the offline decode step with 256 running (bench throughput's decode
# profile), then `raygrid serve` (API_SERVERS API server processes) under a steady 8 requests/s, with 256
# requests sent at once (after their prefills, 256 decode together: the offline step's batch), and with
# 256 kept in flight (each finished request replaced, so prefills share the steps), 512 prompt and 128
# output tokens each. The targets of issue 11: TTFT median <= 30 ms and TPOT median <= 3 ms at 8 req/s;
# TPOT median at 256 in flight <= 1.3x the offline step.
#   [API_SERVERS=1] benchmarks/scripts/online_latency.sh OUT_DIR
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
rg "${bench[@]}" --num-prompts 256 --save-result "$out/burst256.json" > "$out/burst256.log" 2>&1
echo "== 256 at once"; cat "$out/burst256.log"
rg "${bench[@]}" --num-prompts 1024 --max-concurrency 256 --save-result "$out/c256.json" > "$out/c256.log" 2>&1
echo "== 256 in flight"; cat "$out/c256.log"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
step = json.load(open(f"{out}/profile_decode_256x512.json"))["wall_ms_per_step"]
rate8, c256 = json.load(open(f"{out}/rate8.json")), json.load(open(f"{out}/c256.json"))
burst = json.load(open(f"{out}/burst256.json"))
summary = {"offline_decode_step_256_ms": step, "rate8_median_ttft_ms": rate8["median_ttft_ms"],
           "rate8_median_tpot_ms": rate8["median_tpot_ms"],
           "burst256_median_tpot_ms": burst["median_tpot_ms"], "burst256_tpot_over_step": burst["median_tpot_ms"] / step,
           "c256_median_tpot_ms": c256["median_tpot_ms"], "c256_tpot_over_step": c256["median_tpot_ms"] / step}
json.dump(summary, open(f"{out}/latency_summary.json", "w"), indent=2)
print(json.dumps(summary))
PY
kill $server; wait $server
