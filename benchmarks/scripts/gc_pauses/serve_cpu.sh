#!/usr/bin/env bash
# Garbage collections of `raygrid serve` on CPU under 600 requests (64 prompt, 64 output tokens, one client),
# with /health probed: every process's collections of 5 ms or more go to OUT/gc (sitecustomize.py here).
#   bash benchmarks/scripts/gc_pauses/serve_cpu.sh MODEL_DIR OUT [TREE]   # TREE: the checkout whose server runs
set -u
model=$1; out=$(realpath -m "$2"); tree=${3:-.}; here=$(realpath "$(dirname "$0")")
mkdir -p "$out/gc"
(cd "$tree" && PYTHONPATH=$here RAYGRID_GC_LOG_DIR=$out/gc exec python -m raygrid.entrypoints.cli serve --model "$model" \
  --device cpu --dtype float32 --max-model-len 512 --port 8011 --max-queued-requests 100000 --max-num-seqs 256 \
  --log-level warning) > "$out/server.log" 2>&1 &
server=$!
until python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8011/health').status_code != 200)" 2>/dev/null; do sleep 1; done
python "$here/../health_probe.py" http://127.0.0.1:8011 "$out/health.json" & probe=$!
date +%s.%N > "$out/load_start"
python -m raygrid.entrypoints.cli bench serve --base-url http://127.0.0.1:8011 --num-prompts 600 --input-len 64 \
  --output-len 64 --token-id-range 10 1000 --no-progress > "$out/bench.log" 2>&1
date +%s.%N > "$out/load_end"
kill $probe; wait $probe
kill $server; wait $server
