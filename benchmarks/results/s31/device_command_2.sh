#!/usr/bin/env bash
# Thirty-first session, command 2: the batched one-launch pass's launch settings (its products took 10 / 5 / 13 / 6 us
# a layer in command 1, against 3.7 / 3.1 / 7.6 / 4.5 in the one-row pass): deeper pipelines and wider K steps at 4
# and 16 rows; 32 rows again after the block barrier (race) fix; the kernel and engine GPU tests.
# The pass was dropped from the tree after command 1: this command applies its diff first (dropped_persistent_batch.diff).
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-580} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r/pass; R=$OUT/r
git apply benchmarks/results/s31/dropped_persistent_batch.diff 2>/dev/null || patch -s -p1 < benchmarks/results/s31/dropped_persistent_batch.diff
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
P=benchmarks/scripts/persistent_decode_pass.py
summ() { python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for r in d['rows']:
    for v in r['variants']:
        print(d.get('sequences', 1), r['context'], 'engine %.1f' % r['engine_us'], json.dumps(v['variant']), v.get('error') or 'us %.1f x%.2f argmax %s bits %s diff %.3g stages %s' % (v['us'], v['speedup'], v['same_argmax'], v['same_bits_twice'], v['max_abs_diff'], [round(x, 1) for x in v['stage_us_one_pass'].values()]))
" $1; }
for n in 4 16; do
  [ $(left 300) -lt 20 ] && break
  timeout $(left 300) python3 $P $R/pass/batch$n.json --batch --rows $n --contexts 512 --replays 30 \
    --variant '{"num_stages": 4}' --variant '{"num_stages": 5}' --variant '{"k_chunk": 256}' \
    --variant '{"k_chunk": 256, "num_stages": 4}' --variant '{"k_chunk": 64, "num_stages": 5}' \
    --variant '{"block_n": 32, "gate_up_cols": 32, "num_stages": 4}' --variant '{"num_warps": 8}' \
    > $R/pass/batch$n.log 2>&1
  echo "== batch rows $n (exit $?, $(( $(date +%s) - t0 )) s)"; summ $R/pass/batch$n.json 2>&1 | cut -c1-220
done
timeout $(left 330) python3 $P $R/pass/batch32.json --batch --rows 32 --contexts 512 --replays 30 > $R/pass/batch32.log 2>&1
echo "== batch rows 32 (exit $?)"; summ $R/pass/batch32.json 2>&1 | cut -c1-220
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left 585) python3 -m pytest -q -p no:cacheprovider --durations=10 tests/test_persistent_decode.py tests/test_gpu.py \
  -k "persistent" > $R/tests.txt 2>&1
echo "tests exit $? ($(( $(date +%s) - t0 )) s)"; tail -12 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
