#!/usr/bin/env bash
# For the next H200 call (written in the thirty-fifth session, not yet run): where the one-launch pass's extra time
# at 32k goes on an H200 (0.65 ms over a 1.16 ms floor there, 0.44 over 1.64 on an H100), and whether more of the
# cache's tiles in flight take it back. persistent_decode_pass.py times each variant against the engine's layer-by-
# layer pass, checks its bits, and splits one pass by stage (qkv / attention / o_proj / gate_up / down, us a layer).
# About 4 minutes. Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout $(left 300) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 8192 32768 \
  --variant '{"attention_stages": 7}' --variant '{"kv_ahead": 2}' --variant '{"attention_stages": 7, "kv_ahead": 2}' \
  --variant '{"block_n": 64, "attention_stages": 4}' > $R/pass.txt 2>&1
echo "pass exit $?"; tail -12 $R/pass.txt | cut -c1-200
tar -czf $OUT/results.tgz -C $OUT r
