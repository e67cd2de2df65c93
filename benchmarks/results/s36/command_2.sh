#!/usr/bin/env bash
# Thirty-sixth session, second device call (same warm machine as command 1): a lone request's token at 8k and 32k in
# the engine, the default one-launch pass against the variant $2 (a JSON object, set through
# RAYGRID_PERSISTENT_CONFIG), alternating, two rounds; then tests/test_persistent_decode.py under the variant.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
mkdir -p $OUT/r; R=$OUT/r; VARIANT=$2
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
echo "$VARIANT" > $R/variant.json
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 8192 32768 --num-iters 3)
for round in 1 2; do
  timeout 110 bash -c "$(declare -f rg run); out=$R; run lat_default_$round ${lat[*]}" | grep -E "^input|exit"
  RAYGRID_PERSISTENT_CONFIG="$VARIANT" timeout 110 bash -c "$(declare -f rg run); out=$R; run lat_variant_$round ${lat[*]}" | grep -E "^input|exit"
  tar -czf $OUT/results.tgz -C $OUT r
done
RAYGRID_PERSISTENT_CONFIG="$VARIANT" timeout 120 python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py > $R/tests.txt 2>&1; echo "tests exit $?"; tail -1 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
