#!/usr/bin/env bash
# Eighteenth session, second command: the GPU suite on HEAD.
out=$1; cd "$(dirname "$0")/.."
timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_graph_buffers.py tests/test_persistent_decode.py --durations=10 -k 'not past_the_mixed_graphs and not copy_bandwidth' > $out/test_gpu.txt 2>&1; echo "gpu suite exit $?"; tail -25 $out/test_gpu.txt
cp .devrun/s18_b.sh $out/device_command.sh
