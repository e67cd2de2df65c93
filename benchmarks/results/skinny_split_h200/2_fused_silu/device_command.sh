#!/usr/bin/env bash
# Skinny linear: split-K configs + SiLU-and-mul fused into down_proj. GPU kernel tests, GPU tests in full (block 64
# default), batch-1 latency new/old/new/old (old = the previous skinny configs and a separate SiLU-and-mul kernel),
# W1 at the new default.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
out=$R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "skinny or bulk or prefill" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -2 $R/kernel_tests.txt
timeout 175 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; grep -E "passed|failed|^FAILED|^ERROR" $R/gpu_tests.txt | tail -8
L="bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
mkdir -p /tmp/old && tar --exclude=./.device -cf - . | tar -C /tmp/old -xf -; (cd /tmp/old && rewrite raygrid/kernels/triton_linear.py "    return dict(block_n=64 if n > 4096 else 32, block_k=128, split_k=4 if n <= 2048 else 1, num_warps=4, num_stages=4)" "    return dict(block_n=16 if n <= 2048 else 32, block_k=128, split_k=1, num_warps=4, num_stages=4)" && rewrite raygrid/models/llama.py "self.down_proj(ops.SiluAndMulInput(self.gate_up_proj(x)))" "self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))")
for name in lat_new_1 lat_old_1 lat_new_2 lat_old_2; do
  dir=.; [[ $name == lat_old* ]] && dir=/tmp/old
  (cd $dir && PYTHONPATH=/tmp/site:$PWD timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name $L")
done
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
for name in ("lat_new_1", "lat_old_1", "lat_new_2", "lat_old_2"):
    try: d = json.load(open(f"{R}/{name}.json"))
    except Exception as e: print(name, e); continue
    for r in d["results"]: print(name, r["input_len"], "ttft", r["ttft_ms"]["median"], "tpot", r["tpot_ms"]["median"], r["tpot_ms"]["each"], "over floor", round(r["tpot_over_floor"], 3))
PY
timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1 bench throughput --model random-qwen3-0.6b ${w1[*]}"
true
