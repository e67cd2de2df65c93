#!/usr/bin/env bash
# Thirty-third session, call 5 (after s27_h100/command_7.sh on this session's first machine showed W1's first run
# on a fresh machine at 15,617 output tok/s, one prompt step 2.39 s, and triton_compiles.py found a _prefill_kernel and
# a _decode_kernel variant compiled during W1): the fix (prefill inputs unaligned, split decode rows ordered) through
# the compile test; the compile test on the tree before it (must fail); triton_compiles.py on an
# empty cache; a 32k prompt on both trees. In that order: what the run's limit cuts comes last.
# Before the call, on this machine: bash benchmarks/scripts/device_bundle.sh; git archive 4079895 raygrid | gzip >
# .devlite/base_raygrid.tgz (the device's copy of the tree has no history). Carry [".devlite"]; results under $OUT/r.
# $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
R=$OUT/r; mkdir -p $R; REPO=$PWD
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
K="kernel_variants_the_engine_compiled"
TRITON_CACHE_DIR=/tmp/tc_fix timeout $(left 150) python3 -m pytest -p no:cacheprovider -q --durations=5 tests/test_gpu.py -k "$K" > $R/tests_fix.txt 2>&1
echo "fix: tests exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed|failed|^E " $R/tests_fix.txt | head -5 | cut -c1-300
tar -czf $OUT/results.tgz -C $OUT r
mkdir -p /tmp/base && tar -xzf .devlite/base_raygrid.tgz -C /tmp/base && cp -r tests benchmarks /tmp/base/
(cd /tmp/base && PYTHONPATH=/tmp/site:/tmp/base TRITON_CACHE_DIR=/tmp/tc_base timeout $(left 240) python3 -m pytest -p no:cacheprovider -q \
  tests/test_gpu.py -k "kernel_variants_the_engine_compiled" > $R/tests_base.txt 2>&1)
echo "base (4079895): test exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed|failed" $R/tests_base.txt | tail -1
grep -oE "[0-9]+ variants compiled while serving" $R/tests_base.txt | head -1
grep -oE "_(prefill|decode)_kernel [^]]*\]" $R/tests_base.txt | cut -c1-200 | head -4
tar -czf $OUT/results.tgz -C $OUT r
TRITON_CACHE_DIR=$(mktemp -d) timeout $(left 320) python3 benchmarks/scripts/triton_compiles.py $R/compiles_cold_fix.json > $R/compiles_cold_fix.log 2>&1
echo "compiles exit $?"
python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['summary']; print({k: (v['variants'], v.get('output_tok_s')) for k, v in d.items()})" \
  $R/compiles_cold_fix.json
tar -czf $OUT/results.tgz -C $OUT r
out=$R; . benchmarks/scripts/runs.sh
lat="bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 16 --input-len 32768 --num-iters 3"
for side in fix base; do
  dir=$REPO; [ $side = base ] && dir=/tmp/base
  [ $(left 380) -lt 40 ] && break
  (cd $dir && TRITON_CACHE_DIR=/tmp/tc_$side timeout $(left 380) bash -c "$(declare -f rg run); out=$R; run lat_$side $lat" | grep -E "^input|exit")
done
tar -czf $OUT/results.tgz -C $OUT r
