# ---- command 1
# command 1: GPU tests of the step-budget change, then the prompt kernel: HEAD against the candidate
# (second half's scores during the first half's softmax), alternating, in one command
out=$1
nvidia-smi --query-gpu=name,memory.total --format=csv
timeout 200 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "large_gpu or gluon_kernel_match or compiled_at_start" 2>&1 | grep -v -i warn | tail -4 | tee $out/gpu_tests.txt
mkdir -p /tmp/G && tar xzf .devrun/cand.tgz -C /tmp/G
cases=1x8192,1x32768,8x8192,1x8192@24576,1x4096
for i in 1 2; do
  for tree in $PWD /tmp/G; do
    name=$([ $tree = $PWD ] && echo head || echo cand)
    (cd $tree && PYTHONPATH=/tmp/site:$tree timeout 100 python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases $cases \
      --config '{}' --output-json $out/sweep_${name}_$i.json 2>&1 | grep -v -i warn | grep -o "^[0-9]* x [0-9]*.*sdpa.*\|'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*" | sed "s/^/$name /")
  done
done

# ---- command 2
# command 2: 32k TTFT at the new offline default (16k a step) against 8k and transformers; the candidate kernel; W1 A/B
out=$1
. benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64)
run lat_16k_1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run lat_8k "${lat[@]}" --num-iters 3 --max-num-batched-tokens 8192 2>&1 | grep -i "tpot\|exit" | head -4
run lat_hf "${lat[@]}" --num-iters 2 --backend hf 2>&1 | grep -i "tpot\|exit" | head -4
mkdir -p /tmp/G && tar xzf .devrun/cand.tgz -C /tmp/G
(cd /tmp/G && export PYTHONPATH=/tmp/site:/tmp/G && run lat_cand_16k "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4)
run lat_16k_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run w1_16k bench throughput --model random-qwen3-0.6b --num-prompts 256 "${w1[@]}" 2>&1 | tail -2
run w1_8k bench throughput --model random-qwen3-0.6b --num-prompts 256 "${w1[@]}" --max-num-batched-tokens 8192 2>&1 | tail -2
cd $out && tar czf runs.tgz lat_* w1_* && rm -f lat_* w1_*

# ---- command 3
# command 3 (commit in RAYGRID_GIT_COMMIT): GPU tests of the kernel and the budget; 32k TTFT against transformers, twice
out=$1
. benchmarks/scripts/runs.sh
timeout 200 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "prefill or gluon" 2>&1 | grep -v -i warn | tail -3 | tee $out/kernel_tests.txt
timeout 200 python3 -m pytest tests/test_gpu.py -q -s -p no:cacheprovider -k "gluon or large_gpu" 2>&1 | grep -v -i warn | grep "Gluon against\|passed\|failed\|Error" | tail -5 | tee $out/gpu_tests.txt
timeout 100 python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,1x4096 \
  --config '{}' --config '{"gluon": false}' --output-json $out/sweep.json 2>&1 | grep -v -i warn | grep -o "^[0-9]* x [0-9]*.*sdpa.*\|'gluon': [a-zA-Z0-9:\"']*, 'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*"
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64)
run lat_1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run lat_hf "${lat[@]}" --num-iters 2 --backend hf 2>&1 | grep -i "tpot\|exit" | head -4
run lat_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run lat_8k "${lat[@]}" --num-iters 3 --max-num-batched-tokens 8192 2>&1 | grep -i "tpot\|exit" | head -4
cd $out && tar czf lat.tgz lat_* && rm -f lat_*

# ---- command 4
# command 4: the fused gate_up + SiLU-and-mul kernel against cuBLAS + SiLU-and-mul (uncommitted tree on 0745c36)
out=$1
timeout 300 python3 benchmarks/scripts/sweep_gate_up_silu.py --output-json $out/sweep_gate_up.json 2>&1 | grep -v -i warn

# ---- command 5
# command 5: elementwise kernels with several rows a program; where a 32k prompt's time goes at 16k steps
out=$1
timeout 150 python3 benchmarks/scripts/sweep_rows_per_program.py --output-json $out/sweep_rows.json 2>&1 | grep -v -i warn
timeout 200 python3 benchmarks/scripts/ttft_profile.py $out/ttft --input-len 32768 --variants budget16k --no-trace 2>&1 | grep -v -i warn | tail -5
sed -n '/Self CUDA %/,$p' $out/ttft/torch_budget16k.txt | head -40

# ---- command 6
# command 6: the Gluon kernel with two steps an iteration ("paired") against one (uncommitted tree on 0745c36)
out=$1
RAYGRID_PREFILL_CONFIG='{"gluon": "paired"}' timeout 150 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "gluon" 2>&1 | grep -v -i warn | tail -3 | tee $out/kernel_tests_paired.txt
for i in 1 2; do
timeout 100 python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,1x4096 \
  --config '{}' --config '{"gluon": "paired"}' --output-json $out/sweep_paired_$i.json 2>&1 | grep -v -i warn | grep -o "^[0-9]* x [0-9]*.*sdpa.*\|'gluon': [a-zA-Z0-9:\"']*, 'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*"
done

# command 7 (22cd2e9): the whole GPU suite; then the budget test against a mutation (the offline default never taken)
out=$1
timeout 420 python3 -m pytest tests/test_gpu.py tests/test_kernels.py -q -p no:cacheprovider -x 2>&1 | grep -v -i warn | tail -4 | tee $out/gpu_suite.txt
rm -rf /tmp/M && mkdir -p /tmp/M && cp -r raygrid tests pyproject.toml /tmp/M/ 2>/dev/null
sed -i 's/    return OFFLINE_LARGE_GPU_BUDGET if large else DEFAULT_BUDGET/    return DEFAULT_BUDGET/' /tmp/M/raygrid/engine/arg_utils.py
grep -c "return DEFAULT_BUDGET" /tmp/M/raygrid/engine/arg_utils.py
(cd /tmp/M && PYTHONPATH=/tmp/site:/tmp/M timeout 100 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k large_gpu 2>&1 | grep -v -i warn | tail -3) | tee $out/mutation.txt

# ---- command 8 (22cd2e9, the warm machine): the KV-sizing test alone (passed), then tests/test_gpu.py whole
timeout 120 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "kv_sizing"
timeout 280 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider --tb=short

# ---- command 9 (22cd2e9 in /tmp/M8, the KV-sizing test's engine given max_num_batched_tokens=8192): test_gpu.py whole, 20 passed
# command 10 (the final tree): tests/test_gpu.py whole
out=$1
timeout 240 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider --tb=short 2>&1 | grep -v -i warn | grep "assert \|passed\|failed\|FAILED" | cut -c1-400 | tail -6 | tee $out/gpu_tests.txt
