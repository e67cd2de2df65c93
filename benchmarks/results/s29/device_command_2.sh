#!/usr/bin/env bash
# Twenty-ninth session, command 2: the split of an eager step's attention (leading decode rows by the decode kernel,
# the prompts by the prefill kernel; c5480c2) on a GPU. Its kernel and engine tests; W1 step by step on one engine
# with the split off and on, twice each; the tiles and the split over W1-like steps of 32, 64 and 96 decode rows
# (the threshold of 64); W1 by `bench throughput`. About 8 minutes. Carry [".devlite"]; results under $OUT/r.
# Ran once, at 7b30d70, with test_kernels.py's selected tests too, cut at 240 s within the tests
# (2_split_tests_7b30d70/README.md; the kernel tests passed): now the engine's GPU tests alone.
# $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r/mixed; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout $(left 240) python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py \
  -k "prefill or decode_kernel or mixed or piecewise or chunks" > $R/gpu_tests.txt 2>&1
echo "gpu tests exit $?"; tail -3 $R/gpu_tests.txt
tar -czf $OUT/results.tgz -C $OUT r  # again after each part: a run cut at its limit keeps what it did
timeout $(left 380) python3 benchmarks/scripts/w1_step_timeline.py $R/timeline_split.json \
  --prefill-tile-choices '{"split_decode_rows": 0}' '{}' '{"split_decode_rows": 0}' '{}' > $R/timeline_split.log 2>&1
echo "timeline exit $?"; grep -E "W1 " $R/timeline_split.log
python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['runs']:
    print(r['prefill_tile_choice']['split_decode_rows'], r['output_tok_s'], ' '.join(f\"{s['requests']}:{s['gpu_ms']:.1f}\" for s in r['prompt_steps'][:19]), '| prompt gpu s', r['buckets']['with prompt tokens']['gpu_s'])
" $R/timeline_split.json
tar -czf $OUT/results.tgz -C $OUT r
for c in "32 700 14 560" "64 700 14 560" "96 700 14 560"; do
  [ $(left 470) -lt 30 ] && break
  set -- $c
  timeout $(left 470) python3 benchmarks/scripts/sweep_mixed_attention.py --quick --decodes $1 --context $2 --prompts $3 \
    --prompt-len $4 --output-json $R/mixed/d$1_c$2_p$3x$4.json > $R/mixed/d$1_c$2_p$3x$4.txt 2>&1
  echo "== $c (exit $?)"; grep -E "block_m=128 pack=2 block_n=64 warps=4 stages=3 tma=True|^split|^decode kernel alone" $R/mixed/d$1_c$2_p$3x$4.txt | cut -c1-100
done
tar -czf $OUT/results.tgz -C $OUT r
out=$R; . benchmarks/scripts/runs.sh
timeout $(left 580) bash -c "$(declare -f rg run); out=$R; w1=(${w1[*]}); run w1 bench throughput --model random-qwen3-0.6b \"\${w1[@]}\" --num-prompts 256" | tail -3
tar -czf $OUT/results.tgz -C $OUT r
