# Four device commands on one H200 (2026-12-04, fourth session), each run from the repository root as:
#   mkdir -p /tmp/site/ray; bash .device/install.sh; export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 ... RAYGRID_CACHE=/tmp/rgc; bash SCRIPT $OUT
# .devrun/gtree.tgz was the tree at 54956c4 with candidate_gluon_ws.diff applied (commands 1 and 2: with the diff of
# that moment; command 1's is ../prefill_gluon_h200/candidate_gluon_pairs_fa3_schedule.diff). Command 3 ran
# 54956c4 with dropped_skinny_preload.diff applied; command 4 ran 54956c4 itself.

# ---- command 1: the FA3-schedule pairs kernel (p7.sh)
out=$1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
mkdir -p /tmp/G && tar xzf .devrun/gtree.tgz -C /tmp/G && cp .devrun/gluon_check.py /tmp/G/
cd /tmp/G
export PYTHONPATH=/tmp/site:/tmp/G
python3 gluon_check.py pairs 2>&1 | grep -v -i warn | tr -d '\n ' ; echo
for i in 1 2; do
python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,16x512 \
  --config '{}' --config '{"gluon": "pairs"}' --output-json $out/sweep_pairs_fa3_$i.json 2>&1 | grep -v -i warn | grep -o "^[0-9]* x [0-9]*.*sdpa.*\|'gluon': [a-zA-Z\"']*, 'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*"
done

# ---- command 2: the warp-specialized kernels (p8.sh)
out=$1
mkdir -p /tmp/G && tar xzf .devrun/gtree.tgz -C /tmp/G && cp .devrun/gluon_check.py /tmp/G/
cd /tmp/G
export PYTHONPATH=/tmp/site:/tmp/G
for m in ws8 ws; do echo "check $m"; timeout 120 python3 gluon_check.py $m 2>&1 | grep -v -i warn | tr -d '\n ' | tail -c 1500; echo; done
timeout 300 python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,16x512 \
  --config '{}' --config '{"gluon": "ws8"}' --config '{"gluon": "ws8:3"}' --config '{"gluon": "ws8:5"}' --config '{"gluon": "ws"}' \
  --output-json $out/sweep_ws.json 2>&1 | grep -v -i warn | grep -o "^[0-9]* x [0-9]*.*sdpa.*\|'gluon': [a-zA-Z0-9:\"']*, 'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*"

# ---- command 3: weights read before the PDL wait (p9.sh)
out=$1
. benchmarks/scripts/runs.sh
timeout 200 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "skinny" 2>&1 | tail -3
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64 --num-iters 3)
for r in 1 2; do for v in 0 512 1024; do
  RAYGRID_SKINNY_PRELOAD=$v run lat_p${v}_$r "${lat[@]}" 2>&1 | grep -i "tpot\|ttft\|exit" | head -6
done; done
cd $out && tar czf lat.tgz lat_* && rm -f lat_*

# ---- command 4: raygrid against transformers, and W1 (p10.sh)
out=$1
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64)
run lat_raygrid_1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run lat_hf "${lat[@]}" --num-iters 2 --backend hf 2>&1 | grep -i "tpot\|exit" | head -4
run lat_raygrid_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run w1_qwen06b bench throughput --model random-qwen3-0.6b "${w1[@]}" 2>&1 | tail -3
cd $out && tar czf final.tgz lat_* w1_* && rm -f lat_* w1_*
