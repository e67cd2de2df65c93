#!/usr/bin/env bash
# Thirty-first session, command 1: the batched one-launch decode pass (kernels/persistent_batch.py, tensor-core
# products, the residual stream in global memory). (1) The pass against the layer-by-layer pass in CUDA graphs by
# rows (3 to 64) and context, with a few launch variants at 4 and 16 rows; (2) its kernel tests and the engine's GPU
# test (the batched launch up to 12 rows against the layer-by-layer engine for every sampling parameter); (3) `bench
# latency` at batches 4, 8 and 16, the batched launch on (RAYGRID_PERSISTENT_BATCH_CONFIG max_rows 64) and off.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-580} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r/pass $OUT/r/lat; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
P=benchmarks/scripts/persistent_decode_pass.py
summ() { python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for r in d['rows']:
    for v in r['variants']:
        print(d.get('sequences', 1), r['context'], 'engine %.1f floor %.1f' % (r['engine_us'], r['floor_us']), json.dumps(v['variant']), v.get('error') or 'us %.1f x%.2f argmax %s bits %s diff %.3g kv %.3g stages %s' % (v['us'], v['speedup'], v['same_argmax'], v['same_bits_twice'], v['max_abs_diff'], v['kv_max_diff'], [round(x, 1) for x in v['stage_us_one_pass'].values()]))
" $1; }
for c in "4 512 2048 8192" "16 512 2048 8192" "8 512 2048 8192" "3 512 2048" "32 512 2048" "64 512 2048"; do
  [ $(left 250) -lt 20 ] && break
  set -- $c; n=$1; shift
  variants=()
  if [ $n = 4 ] || [ $n = 16 ]; then
    variants=(--variant '{"k_chunk": 64}' --variant '{"block_n": 32, "gate_up_cols": 32}' --variant '{"num_stages": 2}')
  fi
  timeout $(left 250) python3 $P $R/pass/batch$n.json --batch --rows $n --contexts "$@" --replays 30 "${variants[@]}" > $R/pass/batch$n.log 2>&1
  echo "== batch rows $n (exit $?, $(( $(date +%s) - t0 )) s)"; summ $R/pass/batch$n.json 2>&1 | cut -c1-260
done
tar -czf $OUT/results.tgz -C $OUT r  # again after each part: a run cut at its limit keeps what it did
timeout $(left 430) python3 -m pytest -q -p no:cacheprovider --durations=10 tests/test_persistent_decode.py tests/test_gpu.py \
  -k "persistent" > $R/tests.txt 2>&1
echo "tests exit $? ($(( $(date +%s) - t0 )) s)"; tail -12 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
out=$R/lat; . benchmarks/scripts/runs.sh
for b in 8 4 16; do
  for on in 1 0; do
    [ $(left 585) -lt 45 ] && break 2
    cfg='{}'; [ $on = 1 ] && cfg='{"max_rows": 64}'
    RAYGRID_PERSISTENT_BATCH_CONFIG=$cfg timeout $(left 585) bash -c "$(declare -f rg run); out=$R/lat; run b${b}_batch$on bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 2048 --num-iters 2 --batch-size $b"
  done
done
tar -czf $OUT/results.tgz -C $OUT r
