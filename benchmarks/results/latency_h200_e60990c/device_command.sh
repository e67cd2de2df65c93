# Seventh session's one device command (2026-12-04, e60990c, no engine change since the sixth session): batch-1
# 32k TTFT and TPOT, raygrid against transformers, in one command. Run on one H200 from the repository root as
#   mkdir -p /tmp/site/ray; bash .device/install.sh; export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 \
#     TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=e60990c; bash device_command.sh OUT
out=$1
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 32768 --output-len 64)
run lat_1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "ttft\|tpot\|exit" | head -4
run lat_hf "${lat[@]}" --num-iters 2 --backend hf 2>&1 | grep -i "ttft\|tpot\|exit" | head -4
run lat_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "ttft\|tpot\|exit" | head -4
