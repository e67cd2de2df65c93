#!/usr/bin/env bash
# Eighteenth session, fourth command: the GPU suite with persistent_decode on by default.
out=$1; cd "$(dirname "$0")/.."
python3 -c 'from raygrid.engine.arg_utils import EngineArgs; print("persistent_decode default", EngineArgs(model="x").persistent_decode)'
timeout 270 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_graph_buffers.py --durations=8 > $out/test_gpu_persistent_default.txt 2>&1; echo "gpu suite exit $?"; tail -22 $out/test_gpu_persistent_default.txt
cp .devrun/s18_d.sh $out/device_command.sh
