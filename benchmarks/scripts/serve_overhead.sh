#!/usr/bin/env bash
# The Ray Serve application's overhead, in one command: the same load on `raygrid serve` (one process, the
# engine core in a process of its own) and on `raygrid serve --ray-serve` (Serve's proxy -> the OpenAIIngress
# replica -> an EngineServer replica, whose engine process runs the same core), one engine replica each on
# one GPU. At each of RATES requests/s: 512 prompt and 128 output tokens, 300 requests (Poisson arrivals),
# after a warm-up. Writes direct_rateR.json and serve_rateR.json (raygrid bench serve's) and overhead.json.
# PACES: the Serve runs' --stream-messages-per-s, one Serve run each. DP: the Serve app's engine replicas, one GPU
# each (issue #15's x2 run: DP=2); its runs then take DP times the rate and the requests, the same load a GPU, and
# overhead.json compares output throughput a GPU.
# MODEL and TOKEN_IDS (the prompts' id range, "LOW HIGH") default to random-qwen3-0.6b's.
#   [RATES="8 16 32"] [NUM=300] [PACES="1000"] [DP=1] [MODEL=...] [TOKEN_IDS="10 150000"] benchmarks/scripts/serve_overhead.sh OUT_DIR
set -uo pipefail
out=$1
rates=${RATES:-8 16 32}
num=${NUM:-300}
dp=${DP:-1}
mkdir -p "$out"
common=(--model "${MODEL:-random-qwen3-0.6b}" --max-model-len 2048 --max-queued-requests 1000000 --log-level warning)
bench() {  # PORT NAME REPLICAS: the load of each rate, times REPLICAS
  local port=$1 name=$2 scale=$3 b=(bench serve --base-url "http://127.0.0.1:$1" --input-len 512 --output-len 128 --token-id-range ${TOKEN_IDS:-10 150000} --no-progress)
  python3 -m raygrid.entrypoints.cli "${b[@]}" --num-prompts $((64 * scale)) > /dev/null 2>&1   # warm-up
  for rate in $rates; do
    python3 -m raygrid.entrypoints.cli "${b[@]}" --num-prompts $((num * scale)) --request-rate "$(awk "BEGIN {print $rate * $scale}")" \
      --save-result "$out/${name}_rate$rate.json" > "$out/${name}_rate$rate.log" 2>&1
    echo "== $name $rate req/s"; grep -E "completed|output throughput|TTFT|ITL|E2E" "$out/${name}_rate$rate.log"
  done
}
wait_up() { until python3 -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$1/v1/models').status_code != 200)" 2>/dev/null; do
  kill -0 "$2" 2>/dev/null || { echo "server $2 exited"; return 1; }; sleep 1; done; }

(exec python3 -m raygrid.entrypoints.cli serve "${common[@]}" --port 8001) > "$out/direct_server.log" 2>&1 &
server=$!
wait_up 8001 $server && bench 8001 direct 1
kill $server; wait $server

for pace in ${PACES:-1000}; do  # --stream-messages-per-s of each Serve run
  (exec python3 -m raygrid.entrypoints.cli serve "${common[@]}" --ray-serve -dp "$dp" --port 8002 --stream-messages-per-s "$pace") \
    > "$out/serve${pace}_server.log" 2>&1 &
  server=$!
  # up once `raygrid serve --ray-serve` says so (serve.run returns when every replica runs)
  until grep -q "through Ray Serve at" "$out/serve${pace}_server.log"; do
    kill -0 $server 2>/dev/null || { echo "serve exited"; tail -50 "$out/serve${pace}_server.log"; break; }; sleep 1; done
  wait_up 8002 $server && bench 8002 "serve$pace" "$dp"
  kill -INT $server; wait $server
done
PACES="${PACES:-1000}" DP="$dp" python3 - "$out" $rates <<'PY'
import json, os, sys
out, rates = sys.argv[1], sys.argv[2:]
dp = int(os.environ["DP"])
rows = []
for pace in os.environ["PACES"].split():
    for rate in rates:
        d, s = (json.load(open(f"{out}/{name}_rate{rate}.json")) for name in ("direct", f"serve{pace}"))
        s["output_throughput"] /= dp  # a GPU's
        row = {"stream_messages_per_s": float(pace), "rate_per_gpu": float(rate), "serve_replicas": dp,
               "completed": {"direct": d["completed"], "serve": s["completed"]}}
        for key in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms"):
            row[key] = {"direct": d[key], "serve": s[key], "serve_over_direct": s[key] / d[key] if d[key] else None}
        rows.append(row)
json.dump(rows, open(f"{out}/overhead.json", "w"), indent=2)
for r in rows:
    print(f"pace {r['stream_messages_per_s']:g}, {r['rate_per_gpu']:g} req/s a GPU: " + ", ".join(
        f"{k} {v['direct']:.2f} -> {v['serve']:.2f} ({v['serve_over_direct']:.3f}x)"
        for k, v in r.items() if isinstance(v, dict) and v.get("serve_over_direct") is not None))
PY
