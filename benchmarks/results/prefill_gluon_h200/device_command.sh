# Five device commands on one H200 (2026-12-04), each run as:
#   mkdir -p /tmp/site/ray; bash .device/install.sh; export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 ... RAYGRID_CACHE=/tmp/rgc; bash SCRIPT $OUT

# ---- p1.sh (p3.sh ran twice: before and after the block-table prefetch)
out=$1; set -x
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
python3 benchmarks/scripts/ttft_profile.py $out/ttft32k --input-len 32768 --output-len 4 --variants default budget32k --no-trace 2>&1 | grep -v Warning | tail -20
cd $out && tar czf ttft32k.tgz ttft32k && rm -rf ttft32k

# ---- p2.sh (p3.sh ran twice: before and after the block-table prefetch)
out=$1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,16x512 \
  --config '{}' --config '{"ahead": true}' --config '{"ahead": true, "num_stages": 2}' --config '{"ahead": true, "num_stages": 4}' \
  --output-json $out/sweep_ahead.json 2>&1 | grep -v -i warn
for v in A B; do
  if [ $v = B ]; then export RAYGRID_PREFILL_CONFIG='{"ahead": true}'; else unset RAYGRID_PREFILL_CONFIG; fi
  python3 benchmarks/scripts/ttft_profile.py $out/ttft_$v --input-len 32768 --output-len 4 --variants default --no-trace 2>&1 | grep "^default"
done
cd $out && tar czf ttft.tgz ttft_A ttft_B && rm -rf ttft_A ttft_B

# ---- p3.sh (p3.sh ran twice: before and after the block-table prefetch)
out=$1
python3 .devrun/gluon_check.py 2>&1 | grep -v -i warn | tail -40
python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,16x512 \
  --config '{}' --config '{"gluon": true}' --output-json $out/sweep_gluon.json 2>&1 | grep -v -i warn | cut -c1-400

# ---- p4.sh (p3.sh ran twice: before and after the block-table prefetch)
out=$1
python3 .devrun/gluon_check.py pairs 2>&1 | grep -v -i warn | tr -d '\n ' ; echo
python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,16x512 \
  --config '{}' --config '{"gluon": "pairs"}' --output-json $out/sweep_pairs.json 2>&1 | grep -v -i warn | grep -o "^[0-9] x [0-9]*.*sdpa.*\|'gluon': [a-zA-Z\"']*, 'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*"
