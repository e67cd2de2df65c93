#!/usr/bin/env bash
# The GPU check of the thirty-third session's fix (kernel variants compiled during W1 on a fresh machine), written
# then as its call 5 and given a time limit in the thirty-fourth; neither session got a machine, so not yet run.
# (1) The compile test on this tree (must pass) and on 4079895 (must fail: the step whose leading decode rows go to
# the decode kernel compiled variants there); (2) triton_compiles.py on an empty cache with this tree (W1 must
# compile nothing); (3) a 32k prompt on both trees, alternating (the prefill kernels' pointers no longer specialized
# on alignment), in what time is left.
# Before the call: bash benchmarks/scripts/device_bundle.sh; git archive 4079895 raygrid | gzip >
# .devlite/base_raygrid.tgz. Carry [".devlite"]; results under $OUT/r. $1: the commit; $2: the seconds the call
# may run (560 by default; parts past it are cut).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
T=${2:-560}; t0=$(date +%s)
left() { local e=${1:-560}; [ $e -gt $T ] && e=$T; local l=$(( e - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
R=$OUT/r; mkdir -p $R; REPO=$PWD
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
K="kernel_variants_the_engine_compiled"
TRITON_CACHE_DIR=/tmp/tc_fix timeout $(left 150) python3 -m pytest -p no:cacheprovider -q --durations=5 tests/test_gpu.py -k "$K" > $R/tests_fix.txt 2>&1
echo "fix: tests exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed|failed|^E " $R/tests_fix.txt | head -5 | cut -c1-300
tar -czf $OUT/results.tgz -C $OUT r
mkdir -p /tmp/base && tar -xzf .devlite/base_raygrid.tgz -C /tmp/base && cp -r tests benchmarks /tmp/base/
(cd /tmp/base && PYTHONPATH=/tmp/site:/tmp/base TRITON_CACHE_DIR=/tmp/tc_base timeout $(left 270) python3 -m pytest -p no:cacheprovider -q \
  tests/test_gpu.py -k "$K" > $R/tests_base.txt 2>&1)
echo "base (4079895): test exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "passed|failed" $R/tests_base.txt | tail -1
grep -oE "[0-9]+ variants compiled while serving" $R/tests_base.txt | head -1
grep -oE "_(prefill|decode)_kernel [^]]*\]" $R/tests_base.txt | cut -c1-200 | head -4
tar -czf $OUT/results.tgz -C $OUT r
TRITON_CACHE_DIR=$(mktemp -d) timeout $(left 370) python3 benchmarks/scripts/triton_compiles.py $R/compiles_cold_fix.json > $R/compiles_cold_fix.log 2>&1
echo "compiles exit $? ($(( $(date +%s) - t0 )) s)"
python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['summary']; print({k: (v['variants'], v.get('output_tok_s')) for k, v in d.items()})" \
  $R/compiles_cold_fix.json
tar -czf $OUT/results.tgz -C $OUT r
out=$R; . benchmarks/scripts/runs.sh
lat="bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 16 --input-len 32768 --num-iters 3"
for n in 1 2; do for side in fix base; do
  dir=$REPO; [ $side = base ] && dir=/tmp/base
  [ $(left 560) -lt 40 ] && break 2
  (cd $dir && TRITON_CACHE_DIR=/tmp/tc_$side timeout $(left 560) bash -c "$(declare -f rg run); out=$R; run lat_${side}_$n $lat" | grep -E "^input|exit")
  tar -czf $OUT/results.tgz -C $OUT r
done; done
