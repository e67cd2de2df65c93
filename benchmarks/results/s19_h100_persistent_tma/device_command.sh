#!/usr/bin/env bash
# Nineteenth session, command 1: the one-launch pass with attention's tiles by bulk copies (one descriptor over the
# pooled caches): its GPU tests, then the pass against the engine's and against itself gathering rows.
out=$1; cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_persistent_decode.py tests/test_kernels.py -k "persistent or bulk or tma or past_2_31" --durations=5 > $out/tests_kernels.txt 2>&1; echo "kernel tests exit $?"; tail -4 $out/tests_kernels.txt
timeout 200 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass.json --contexts 512 8192 32832 40900 --variant '{"tma": false}' --variant '{"block_n": 128}' > $out/pass.txt 2>&1; echo "pass exit $?"; cut -c1-400 $out/pass.txt | tail -8
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "persistent or launch_only or variants_the_engine" --durations=5 > $out/tests_gpu.txt 2>&1; echo "gpu tests exit $?"; tail -6 $out/tests_gpu.txt
cp .devrun/s19_a.sh $out/device_command.sh
