# one H200, 2026-12-03, tree ddc4425 (the command's prefix sets RAYGRID_GIT_COMMIT=ddc4425)
#!/usr/bin/env bash
# W1 on random-llama3-8b with FP8 weights and KV cache: the one-warp launch for full batches (B, the tree's default)
# against the launch before (A, full_programs_per_sm out of reach), then bf16 for the ratio; then the FP8 kernel tests.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
out=$R
w=("${w1[@]}" --num-prompts 256)
old='{"full_programs_per_sm": 1000000}'
timeout 200 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1_8b_fp8_kv_B bench throughput --model random-llama3-8b ${w[*]} --quantization fp8 --kv-cache-dtype fp8"
RAYGRID_DECODE_CONFIG="$old" timeout 110 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1_8b_fp8_kv_A bench throughput --model random-llama3-8b ${w[*]} --quantization fp8 --kv-cache-dtype fp8"
timeout 110 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1_8b_bf16 bench throughput --model random-llama3-8b ${w[*]}"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "fp8 and (decode or kv)" > $R/gpu_fp8_kernel_tests.txt 2>&1; echo "tests $?"; tail -2 $R/gpu_fp8_kernel_tests.txt
true
