#!/usr/bin/env bash
# For the next session's first device call (written in the thirtieth session, not yet run): the two questions the
# thirtieth session left. (1) The split's threshold: the tiles and the split over W1-like steps of 32, 64 and 96
# decode rows beside 14 prompts of 560 tokens (split_decode_rows is 64). (2) The two-row one-launch pass at the
# engine's context cap (40,960 tokens together: 2 x 20,000), and at 1,024 and 2,048, against the layer-by-layer pass.
# About 5 minutes. Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r/mixed $OUT/r/pass; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
for c in "32 700 14 560" "64 700 14 560" "96 700 14 560"; do
  [ $(left 300) -lt 30 ] && break
  set -- $c
  timeout $(left 300) python3 benchmarks/scripts/sweep_mixed_attention.py --quick --decodes $1 --context $2 --prompts $3 \
    --prompt-len $4 --output-json $R/mixed/d$1_c$2_p$3x$4.json > $R/mixed/d$1_c$2_p$3x$4.txt 2>&1
  echo "== $c (exit $?)"; grep -E "block_m=128 pack=2 block_n=64 warps=4 stages=3 tma=True|^split|^decode kernel alone" $R/mixed/d$1_c$2_p$3x$4.txt | cut -c1-100
done
tar -czf $OUT/results.tgz -C $OUT r  # again after each part: a run cut at its limit keeps what it did
timeout $(left 540) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass/rows2.json --rows 2 --contexts 1024 2048 20000 \
  > $R/pass/rows2.log 2>&1
echo "== rows 2 (exit $?)"; tail -3 $R/pass/rows2.log | cut -c1-160
tar -czf $OUT/results.tgz -C $OUT r
