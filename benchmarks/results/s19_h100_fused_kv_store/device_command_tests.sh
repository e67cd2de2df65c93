#!/usr/bin/env bash
# Nineteenth session, command 2: keys and values stored by the rotary kernels (one launch a layer fewer): the kernel
# tests and the engine's GPU suite (every execution mode against the plain engine, every sampling parameter).
out=$1; cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv,noheader
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "rotary or store" > $out/tests_kernels.txt 2>&1; echo "kernel tests exit $?"; tail -3 $out/tests_kernels.txt
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_graph_buffers.py --durations=5 > $out/tests_gpu.txt 2>&1; echo "gpu suite exit $?"; tail -12 $out/tests_gpu.txt
cp .devrun/s19_c.sh $out/device_command.sh
