#!/usr/bin/env bash
# Thirty-seventh session, second call: (1) the one-launch pass at 512, 8,192 and 32,768 tokens, the default against
# gate_up_proj's tiles read one unit ahead with every first tile read ahead of the barrier (command 1's best) and two
# units ahead (alone, and with preload 31 or 15), each twice, interleaved; (2) a lone request's token in the engine
# at 512, 8k and 32k, the default against $2 (a JSON object through RAYGRID_PERSISTENT_CONFIG), alternating, two
# rounds; (3) the pass's tests and the engine's persistent-decode test (every sampling parameter) under $2.
# Carry [".devlite"]; results under $OUT/r. $1: the commit; $2: the variant.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r; VARIANT=$2
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
echo "$VARIANT" > $R/variant.json
A=(--variant '{"mlp_ahead": 1, "preload": 31}' --variant '{"mlp_ahead": 2}' --variant '{"mlp_ahead": 2, "preload": 31}' \
   --variant '{"mlp_ahead": 2, "preload": 15}')
timeout $(left 150) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass_ahead2.json --contexts 512 8192 32768 \
  "${A[@]}" --variant '{}' "${A[@]}" --variant '{}' > $R/pass_ahead2.txt 2>&1
echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass_ahead2.json > $R/passsum_ahead2.txt
cut -c1-60 $R/passsum_ahead2.txt
python3 benchmarks/scripts/pass_excess.py $R/pass_ahead2.json | grep -E "launch|fixed" | tee $R/excess_ahead2.txt
tar -czf $OUT/results.tgz -C $OUT r
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 3)
for round in 1 2; do
  [ $(left) -lt 200 ] && break
  timeout 95 bash -c "$(declare -f rg run); out=$R; run lat_default_$round ${lat[*]}" | grep -E "^input|exit"
  RAYGRID_PERSISTENT_CONFIG="$VARIANT" timeout 95 bash -c "$(declare -f rg run); out=$R; run lat_variant_$round ${lat[*]}" | grep -E "^input|exit"
  tar -czf $OUT/results.tgz -C $OUT r
done
RAYGRID_PERSISTENT_CONFIG="$VARIANT" timeout $(left 590) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py \
  tests/test_gpu.py -k "persistent" > $R/tests.txt 2>&1; echo "tests exit $?"; tail -2 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
