#!/usr/bin/env bash
# Final tree: block 64 default on a GPU, skinny split-K configs (no SiLU fusion). GPU kernel tests, GPU tests in
# full, batch-1 latency old configs (A) / final (C) alternating, W1 at the default.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "skinny or bulk" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -2 $R/kernel_tests.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; grep -E "passed|failed|^FAILED|^ERROR" $R/gpu_tests.txt | tail -8
CFG_NEW="    return dict(block_n=64 if n > 4096 else 32, block_k=128, split_k=4 if n <= 2048 else 1, num_warps=4, num_stages=4)"
CFG_OLD="    return dict(block_n=16 if n <= 2048 else 32, block_k=128, split_k=1, num_warps=4, num_stages=4)"
mkdir -p /tmp/A && tar --exclude=./.device -cf - . | tar -C /tmp/A -xf -
(cd /tmp/A && rewrite raygrid/kernels/triton_linear.py "$CFG_NEW" "$CFG_OLD")
L="bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
for name in C1; do
  dir=$PWD; [[ $name == A* ]] && dir=/tmp/A
  (cd $dir && PYTHONPATH=/tmp/site:$PWD timeout 52 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_$name $L")
done
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
for name in ("C1",):
    try: d = json.load(open(f"{R}/lat_{name}.json"))
    except Exception as e: print(name, e); continue
    for r in d["results"]: print(name, r["input_len"], "ttft", r["ttft_ms"]["median"], "tpot", r["tpot_ms"]["median"], r["tpot_ms"]["each"], "over floor", round(r["tpot_over_floor"], 3))
PY

true
