#!/usr/bin/env bash
# One H200 (2026-12-03, eighth session): the GPU tests at HEAD, #11's latency script (2 API servers, 4 client
# processes), then W1 on random-qwen3-0.6b twice (the first run also compiles on the fresh machine).
cd "$(dirname "$0")/../../../.."
R=$OUT/r; mkdir -p $R
. benchmarks/scripts/runs.sh
out=$R
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; tail -3 $R/gpu_tests.txt
mkdir -p $R/online_latency
API_SERVERS=2 CLIENTS=4 timeout 230 bash benchmarks/scripts/online_latency.sh $R/online_latency > $R/online_latency.txt 2>&1
echo "online latency $?"; tail -3 $R/online_latency.txt
pkill -f "raygrid.entrypoints.cli serve" || true
for i in 1 2; do timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1_0.6b_$i bench throughput --model random-qwen3-0.6b ${w1[*]} --num-prompts 256"; done
true
