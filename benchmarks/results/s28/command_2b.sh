#!/usr/bin/env bash
# Twenty-eighth session, command 2 (revised): first the attention of W1-like steps with prompt tokens, one launch of
# 16-row or 128-row tiles against the split launch (sweep_mixed_attention.py --quick over a grid of cases: W1's
# prompt steps take 16-row tiles from 129 sequences on, and their GPU time jumps there, 21.1 to 25.7 ms on an H100 in
# command 1), then the batch sweep (command_2.sh) in the time left. Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r/mixed; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
# decodes, their context, prompts, prompt length
for c in "16 700 14 560" "64 700 14 560" "115 700 14 560" "129 700 14 560" "192 700 14 560" "250 700 14 560" \
         "200 1500 14 560" "129 700 7 1120" "256 640 4 512" "256 640 8 512" "128 700 4 1024" "64 1500 2 2048"; do
  set -- $c
  timeout $(left 200) python3 benchmarks/scripts/sweep_mixed_attention.py --quick --decodes $1 --context $2 --prompts $3 \
    --prompt-len $4 --output-json $R/mixed/d$1_c$2_p$3x$4.json > $R/mixed/d$1_c$2_p$3x$4.txt 2>&1
  echo "== $c (exit $?)"; grep -E "block_m=(16|128) pack=2 block_n=64 warps=4 stages=(2|3) tma=(False|True)|^split|decode kernel alone" $R/mixed/d$1_c$2_p$3x$4.txt | cut -c1-100
done
out=$R; . benchmarks/scripts/runs.sh
for b in 1 2 4 8 16; do
  timeout $(left $((300 + 50 * b))) bash -c "$(declare -f rg run); out=$R; run lat_b$b bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 128 --input-len 512 8192 32768 --num-iters 2 --batch-size $b" | grep -E "^input|exit"
done
tar -czf $OUT/results.tgz -C $OUT r
