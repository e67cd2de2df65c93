#!/usr/bin/env bash
# Thirty-sixth session, first device call: (1) s35/next_h200_command.sh's sweep, each variant twice and interleaved
# with the default (the one-launch pass's depth: attention stages and tiles ahead, at 8k and 32k, with per-stage
# timings); (2) part 1 of s30/next_device_command.sh (the split threshold over W1-like steps of 32, 64 and 96 decode
# rows beside 14 prompts of 560 tokens) in what time is left. Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r/mixed; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" | tee -a $R/gpu.txt
# 32-key tiles: 5 stages (the default) hold two tiles in flight a program, 7 three, 9 four; 64-key at 5 two (72 KB).
V=(--variant '{"attention_stages": 7}' --variant '{"attention_stages": 9}' --variant '{"kv_ahead": 2}' \
   --variant '{"attention_stages": 7, "kv_ahead": 2}' --variant '{"block_n": 64, "attention_stages": 5}' --variant '{}')
timeout $(left 360) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 8192 32768 \
  "${V[@]}" "${V[@]}" > $R/pass.txt 2>&1
echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt || tail -14 $R/pass.txt | cut -c1-240
tar -czf $OUT/results.tgz -C $OUT r
for c in "32 700 14 560" "64 700 14 560" "96 700 14 560"; do
  [ $(left) -lt 70 ] && break
  set -- $c
  timeout $(left) python3 benchmarks/scripts/sweep_mixed_attention.py --quick --decodes $1 --context $2 --prompts $3 \
    --prompt-len $4 --output-json $R/mixed/d$1_c$2_p$3x$4.json > $R/mixed/d$1_c$2_p$3x$4.txt 2>&1
  echo "== $c (exit $?)"; grep -E "block_m=128 pack=2 block_n=64 warps=4 stages=3 tma=True|^split|^decode kernel alone" $R/mixed/d$1_c$2_p$3x$4.txt | cut -c1-100
  tar -czf $OUT/results.tgz -C $OUT r
done
