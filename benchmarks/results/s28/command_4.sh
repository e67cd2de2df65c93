#!/usr/bin/env bash
# Twenty-eighth session, command 4 (command 3 cut to the device time left): the engine's GPU tests of steps with
# prefill, then W1 step by step on one engine with the prompt attention's tiles by shapes (the old rule) and by the
# batch's lengths (the new), alternating. Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout $(left 120) python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "prefill or mixed or piecewise or chunks" \
  > $R/gpu_tests.txt 2>&1; echo "gpu tests exit $?"; tail -2 $R/gpu_tests.txt
tar -czf $OUT/results.tgz -C $OUT r  # again after each part: a run cut at its limit keeps what it did
timeout $(left 230) python3 benchmarks/scripts/w1_step_timeline.py $R/timeline_ab.json --prefill-tile-rules shape cost shape cost \
  > $R/timeline_ab.log 2>&1; echo "timeline exit $?"; grep -E "W1 " $R/timeline_ab.log
python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['runs']:
    print(r['prefill_tile_rule'], r['output_tok_s'], ' '.join(f\"{s['requests']}:{s['gpu_ms']:.1f}\" for s in r['prompt_steps'][:19]), '| prompt gpu s', r['buckets']['with prompt tokens']['gpu_s'])
" $R/timeline_ab.json
tar -czf $OUT/results.tgz -C $OUT r
