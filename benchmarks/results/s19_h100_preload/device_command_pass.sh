#!/usr/bin/env bash
# Nineteenth session, command 4: the one-launch pass reading each product's first weight tile between a barrier's
# arrival and its wait (PRELOAD flags; default qkv and o_proj): its GPU tests, then the pass against the engine's, by flags.
out=$1; cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv,noheader
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_persistent_decode.py > $out/tests_kernel.txt 2>&1; echo "kernel tests exit $?"; tail -2 $out/tests_kernel.txt
timeout 220 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass.json --contexts 512 8192 32832 --variant '{"preload": 0}' --variant '{"preload": 2}' --variant '{"preload": 1}' --variant '{"preload": 15}' > $out/pass.txt 2>&1; echo "pass exit $?"; cut -c1-330 $out/pass.txt | tail -15
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "persistent" > $out/tests_gpu.txt 2>&1; echo "gpu tests exit $?"; tail -2 $out/tests_gpu.txt
cp .devrun/s19_e.sh $out/device_command.sh
