#!/usr/bin/env bash
# Offline and online throughput of one workload (N requests of 512 prompt and 128 output tokens) in one
# command: offline `bench throughput` (detokenizing, as a server must), then `raygrid serve` with the engine
# core in its own process and with it on a thread of the API process, each driven by `bench serve` with all
# requests at once while /health is probed.
#   benchmarks/scripts/online_vs_offline.sh OUT_DIR [N]
set -uo pipefail
out=$1; n=${2:-2000}
rg() { python3 -m raygrid.entrypoints.cli "$@"; }
common=(--model "${MODEL:-random-qwen3-0.6b}" --dtype "${DTYPE:-bfloat16}" ${EXTRA:-})
rg bench throughput "${common[@]}" --num-prompts "$n" --input-len 512 --output-len 128 --detokenize --no-progress \
  --output-json "$out/offline.json" > "$out/offline.log" 2>&1
tail -1 "$out/offline.log"
for mode in process inprocess; do
  flag=(); [ "$mode" = inprocess ] && flag=(--engine-in-process)
  rg serve "${common[@]}" --port 8000 --max-queued-requests 1000000 --log-level warning "${flag[@]}" > "$out/server_$mode.log" 2>&1 &
  server=$!
  until python3 -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8000/health').status_code != 200)" 2>/dev/null; do sleep 1; done
  bench=(bench serve --base-url http://127.0.0.1:8000 --input-len 512 --output-len 128 --token-id-range 10 "${MAX_ID:-150000}" --no-progress)
  rg "${bench[@]}" --num-prompts 64 > /dev/null 2>&1   # warm-up: kernels compiled, allocator grown
  python3 benchmarks/scripts/health_probe.py http://127.0.0.1:8000 "$out/health_$mode.json" & probe=$!
  rg "${bench[@]}" --num-prompts "$n" --save-result "$out/online_$mode.json" > "$out/online_$mode.log" 2>&1
  kill $probe; wait $probe
  echo "== $mode"; grep -E "output throughput|TTFT|TPOT|completed" "$out/online_$mode.log"; cat "$out/health_$mode.json"
  kill $server; wait $server
done
