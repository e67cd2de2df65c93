#!/usr/bin/env bash
# Written in the twenty-eighth session (as results/s28/next_device_command.sh), run as the twenty-ninth's command 1
# at e6c8e5e, with --prefill-tile-rules (since replaced by --prefill-tile-choices '{"rule": "shape"}'). In order of need: the engine's GPU
# tests of steps with prefill at the tree that picks the prompt attention's tiles from the batch's lengths; W1 step by
# step on one engine, the old rule and the new alternating (the A/B that would keep or drop it); nan_probe.py
# (command 1's NaN in nano_batch_overlap.py's 256-row pass); the fixed `bench latency` at batches of 2 and 8; the
# tiles against each other over W1-like cases (sweep_mixed_attention.py), which the rule's weight is checked against.
# About 9 minutes. Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r/mixed; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout $(left 150) python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "prefill or mixed or piecewise or variants or chunks" \
  > $R/gpu_tests.txt 2>&1; echo "gpu tests exit $?"; tail -2 $R/gpu_tests.txt
tar -czf $OUT/results.tgz -C $OUT r  # again after each part: a run cut at its limit keeps what it did
timeout $(left 280) python3 benchmarks/scripts/w1_step_timeline.py $R/timeline_ab.json --prefill-tile-rules shape cost shape cost \
  > $R/timeline_ab.log 2>&1; echo "timeline exit $?"; grep -E "W1 " $R/timeline_ab.log
python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['runs']:
    print(r['prefill_tile_rule'], r['output_tok_s'], ' '.join(f\"{s['requests']}:{s['gpu_ms']:.1f}\" for s in r['prompt_steps'][:19]), '| prompt gpu s', r['buckets']['with prompt tokens']['gpu_s'])
" $R/timeline_ab.json
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left 310) python3 benchmarks/results/s28/nan_probe.py $R/nan_triton.json 2>&1 | tail -1 | cut -c1-400
RAYGRID_USE_TRITON=0 timeout $(left 350) python3 benchmarks/results/s28/nan_probe.py $R/nan_torch.json 2>&1 | tail -1 | cut -c1-400
tar -czf $OUT/results.tgz -C $OUT r
out=$R; . benchmarks/scripts/runs.sh
for b in 2 8; do
  timeout $(left $((350 + 80 * b / 2))) bash -c "$(declare -f rg run); out=$R; run lat_b$b bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 128 --input-len 512 8192 32768 --num-iters 2 --batch-size $b" | grep -E "^input|exit"
done
tar -czf $OUT/results.tgz -C $OUT r
for c in "16 700 14 560" "129 700 14 560" "250 700 14 560" "200 1500 14 560" "129 700 7 1120" "256 640 4 512" "256 640 8 512" "128 700 4 1024"; do
  [ $(left 580) -lt 30 ] && break
  set -- $c
  timeout $(left 580) python3 benchmarks/scripts/sweep_mixed_attention.py --quick --decodes $1 --context $2 --prompts $3 \
    --prompt-len $4 --output-json $R/mixed/d$1_c$2_p$3x$4.json > $R/mixed/d$1_c$2_p$3x$4.txt 2>&1
  echo "== $c (exit $?)"; grep -E "block_m=(16|128) pack=2 block_n=64 warps=4 stages=(2 tma=False|3 tma=True)|^split" $R/mixed/d$1_c$2_p$3x$4.txt | cut -c1-100
done
tar -czf $OUT/results.tgz -C $OUT r
