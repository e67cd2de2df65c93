#!/usr/bin/env bash
# Thirty-seventh session, for an H200 only (exits at once on another card): (1) the one-launch pass at 512, 8,192 and
# 32,768 tokens, the default (gate_up_proj a unit ahead, every first tile read ahead) against the default before it
# and the attention stage's depth (7 and 9 stages, two 64-key tiles in flight); pass_excess.py on the record (the
# fixed part and the part that grows, on the H200); (2) kv_read_probe.py --quick --cases head tma; (3) a lone
# request's token at 32k end to end (bench latency). Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
grep -q H200 $R/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
V=(--variant '{"mlp_ahead": false, "preload": 11}' --variant '{"attention_stages": 7}' --variant '{"attention_stages": 9}' \
   --variant '{"block_n": 64, "attention_stages": 5}' --variant '{}')
timeout $(left 300) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 512 8192 32768 "${V[@]}" \
  > $R/pass.txt 2>&1
echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt | cut -c1-150
python3 benchmarks/scripts/pass_excess.py $R/pass.json --json $R/excess.json | grep -E "launch|fixed" | tee $R/excess.txt
tar -czf $OUT/results.tgz -C $OUT r
(cd benchmarks/scripts && timeout $(left 400) python3 kv_read_probe.py $R/kv_read_probe.json --quick --cases head tma > $R/kv_read_probe.log 2>&1; echo "probe exit $?")
cut -c1-150 $R/kv_read_probe.log | tail -8
tar -czf $OUT/results.tgz -C $OUT r
out=$R; . benchmarks/scripts/runs.sh
timeout $(left 585) bash -c "$(declare -f rg run); out=$R; run lat_32k bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 3" | grep -E "^input|exit"
tar -czf $OUT/results.tgz -C $OUT r
