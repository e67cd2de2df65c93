#!/usr/bin/env bash
# Forty-first session, on any card (#21's cells; on an H200 the ones the issue sets): a 32k prompt against
# transformers with SDPA (raygrid, then transformers: TTFT, and raygrid's token at 32k against its floor), W1, then
# on an H200 the one-launch pass at 512, 8,192 and 32,768 tokens (the default against 7 attention stages and 64-key
# tiles) and its fixed part; on another card, or with time left, raygrid's 32k prompt again and W1 again.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
lat32k lat_rg1 "--output-len 64 --num-iters 3" 140
lat32k lat_hf "--backend hf --output-len 16 --num-iters 2" 250
w1run w1_1 330
tar -czf $OUT/results.tgz -C $OUT r
if grep -q H200 $R/gpu.txt; then
  timeout $(left 500) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 512 8192 32768 \
    --variant '{}' --variant '{"attention_stages": 7}' --variant '{"block_n": 64, "attention_stages": 5}' > $R/pass.txt 2>&1
  echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt | cut -c1-160
  python3 benchmarks/scripts/pass_excess.py $R/pass.json --json $R/excess.json | grep -E "launch|fixed" | tee $R/excess.txt
  tar -czf $OUT/results.tgz -C $OUT r
fi
[ $(left 570) -gt 70 ] && lat32k lat_rg2 "--output-len 64 --num-iters 3" 490
[ $(left 570) -gt 60 ] && w1run w1_2 570
tar -czf $OUT/results.tgz -C $OUT r
