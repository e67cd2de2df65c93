#!/usr/bin/env bash
# Thirtieth session, command 1: the one-launch decode pass for a few rows (rows=2..4, the engine's launches for decode
# steps of up to PERSISTENT_CONFIG["max_rows"] requests). Its kernel tests and the engine's GPU test of it, with the
# twenty-ninth session's engine test of the split attention (decode rows by the decode kernel); the pass
# by rows against the layer-by-layer pass; the one-row pass against 4f3c754's kernel (carried as
# .devlite/persistent_decode_base.py) in the same command; `bench latency` at batch 2, the pass on and off.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r/pass; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
cp .devlite/persistent_decode_base.py raygrid/kernels/persistent_decode_base.py
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout $(left 270) python3 -m pytest -q -p no:cacheprovider --durations=10 tests/test_persistent_decode.py tests/test_gpu.py \
  -k "persistent or decode_kernel" > $R/tests.txt 2>&1
echo "tests exit $?"; tail -14 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r  # again after each part: a run cut at its limit keeps what it did
P=benchmarks/scripts/persistent_decode_pass.py
summ() { python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for r in d['rows']:
    for v in r['variants']:
        print(d.get('sequences', 1), r['context'], 'engine %.1f floor %.1f' % (r['engine_us'], r['floor_us']), v.get('error') or 'us %.1f x%.2f argmax %s bits %s kv %.3g' % (v['us'], v['speedup'], v['same_argmax'], v['same_bits_twice'], v['kv_max_diff']))
" $1; }
for k in base new base new; do
  [ $(left 400) -lt 20 ] && break
  m=raygrid.kernels.persistent_decode; [ $k = base ] && m=raygrid.kernels.persistent_decode_base
  timeout $(left 400) python3 $P $R/pass/rows1_$k.json --contexts 512 8192 32768 --kernel-module $m > $R/pass/rows1_$k.log 2>&1
  echo "== rows 1 $k (exit $?)"; summ $R/pass/rows1_$k.json 2>&1 | tail -3
done
tar -czf $OUT/results.tgz -C $OUT r
for n in 2 3 4 8; do
  [ $(left 470) -lt 20 ] && break
  timeout $(left 470) python3 $P $R/pass/rows$n.json --rows $n --contexts 512 4096 16384 > $R/pass/rows$n.log 2>&1
  echo "== rows $n (exit $?)"; summ $R/pass/rows$n.json 2>&1 | tail -3
done
tar -czf $OUT/results.tgz -C $OUT r
out=$R; . benchmarks/scripts/runs.sh
for p in persistent-decode no-persistent-decode; do
  [ $(left 580) -lt 40 ] && break
  timeout $(left 580) bash -c "$(declare -f rg run); out=$R; run lat_$p bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 --num-iters 2 --batch-size 2 --$p"
done
tar -czf $OUT/results.tgz -C $OUT r
