#!/usr/bin/env bash
# Commit e17eaa8: the GPU suite (the compile test now with every sampling feature), the GPU kernel tests, and W1 with
# decode profiles (256 x 512 and 32 x 1536) to see where a decode step's time goes now.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; grep -E "passed|failed|^FAILED|^ERROR|variants compiled" $R/gpu_tests.txt | tail -8
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; grep -E "passed|failed|^FAILED|^ERROR" $R/kernel_tests.txt | tail -6
mkdir -p $R/prof
timeout 120 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1_prof bench throughput --model random-qwen3-0.6b ${w1[*]} --profile-dir $R/prof" | grep -E "exit|tok/s"
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
try:
    d = json.load(open(f"{R}/w1_prof.json"))
    for p in d.get("decode_profiles") or []:
        print(json.dumps(p)[:1500])
except Exception as e:
    print("no profile", e)
PY
ls $R/prof | head
true
