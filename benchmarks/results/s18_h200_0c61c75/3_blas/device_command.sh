#!/usr/bin/env bash
# Eighteenth session, third command (the sixteenth session's command 1): PyTorch's GEMM paths (cuBLAS, cuBLASLt) at
# W1's row counts; the engine's start with piecewise graphs to 8,192 (HEAD) against 201bacd (to 2,048); W1 with
# TORCH_BLAS_PREFER_CUBLASLT=1 against the default, alternating. Everything lands in one archive (8 files come back).
res=$1; out=/tmp/s18c1; mkdir -p $out; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv > $out/gpu.txt
timeout 150 python3 benchmarks/scripts/sweep_blas_backends.py $out/blas_backends.json 2>&1 | tail -20
for side in base new base new; do
  dir=.; [ $side = base ] && dir=.devrun/base
  (cd $dir && python3 - $side <<'PY'
import sys, time
t = time.perf_counter()
from raygrid import LLM
llm = LLM(model="random-qwen3-0.6b", dtype="bfloat16")
print(sys.argv[1], "engine start", round(time.perf_counter() - t, 2), "s", flush=True)
llm.shutdown()
PY
  ) 2>&1 | grep -E 'engine start|Error|error' | cut -c1-300
done | tee $out/start_times.txt
TORCH_BLAS_PREFER_CUBLASLT=1 python3 -c 'import torch; print("env gives", torch.backends.cuda.preferred_blas_library())'
for round in 1 2; do
  run w1_cublas_$round bench throughput "${w1[@]}" --model random-qwen3-0.6b --num-prompts 256
  TORCH_BLAS_PREFER_CUBLASLT=1 run w1_cublaslt_$round bench throughput "${w1[@]}" --model random-qwen3-0.6b --num-prompts 256
done
for f in $out/w1_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], round(d['output_tokens_per_s'], 1), [(w['kind'], w['seconds']) for w in d.get('where_the_time_goes', [])])" $f; done
cp .devrun/s18_c1.sh $out/device_command.sh
tar czf $res/s18_c1.tgz -C /tmp s18c1
