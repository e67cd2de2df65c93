#!/usr/bin/env bash
# Eighteenth session, first command: the two GPU tests no GPU has run, then batch-1 latency (s18_c3.sh).
out=$1; cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "past_the_mixed_graphs or copy_bandwidth" --durations=5 > $out/test_never_run.txt 2>&1; echo "never-run exit $?"; tail -15 $out/test_never_run.txt
timeout 390 bash .devrun/s18_c3.sh $out; echo "latency exit $?"
cp .devrun/s18_a.sh $out/device_command_a.sh
