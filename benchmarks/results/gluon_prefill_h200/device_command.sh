# Device commands of the Gluon prefill kernel (2026-12-04, fourth session), run as the ones in ../ws_preload_h200/.

# ---- command 5: Nsight Compute on both kernels at 1 x 8,192 (7e20ee2; .devrun/ncu_case.py is benchmarks/scripts/ncu_prefill_case.py)
out=$1
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
python3 .devrun/ncu_case.py && echo case-ok
timeout 400 $NCU --clock-control none --nvtx --nvtx-include "measured/" --launch-count 4 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats --section SourceCounters \
  --import-source no -o $out/prefill python3 .devrun/ncu_case.py > $out/ncu_log.txt 2>&1; echo "ncu exit $?"; tail -5 $out/ncu_log.txt
$NCU --import $out/prefill.ncu-rep --page details > $out/details.txt 2>&1
grep -n "prefill_kernel\|sdpa\|fmha\|flash\|cudnn\|Duration\|Throughput\|Stall\|Warp Cycles\|Issued\|Eligible\|Registers\|Achieved Occupancy\|Theoretical Occupancy\|Block Limit\|Pipe\|Busy" $out/details.txt | head -150
cd $out && tar czf ncu.tgz prefill.ncu-rep details.txt ncu_log.txt && rm -f prefill.ncu-rep

# ---- command 6: the report's pipes and per-instruction stall samples (the same machine, the report carried back)
out=$1
ncu --import .devrun/rep/prefill.ncu-rep --page raw --csv > $out/raw.csv 2>&1; echo "raw $?"
python3 - $out/raw.csv <<'PY' > $out/stalls.txt
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]
for r in rows[2:]:
    name = r[hdr.index("Kernel Name")][:40]
    print("==", name)
    for i, h in enumerate(hdr):
        if ("warp_issue_stalled" in h and h.endswith("per_warp_active.pct")) or "pipe_tensor" in h or "inst_executed_pipe" in h and "pct" in h:
            try:
                v = float(r[i].replace(",", ""))
            except ValueError:
                continue
            if v > 0.5:
                print(f"  {h}: {v}")
PY
cat $out/stalls.txt | head -120
ncu --import .devrun/rep/prefill.ncu-rep --page source --print-source sass --csv -k regex:_prefill_kernel > $out/sass_prefill.csv 2>&1; echo "src $?"; head -c 600 $out/sass_prefill.csv
ncu --import .devrun/rep/prefill.ncu-rep --page source --print-source sass --csv -k regex:cudnn > $out/sass_cudnn.csv 2>&1; echo "src $?"
cd $out && tar czf src.tgz raw.csv sass_prefill.csv sass_cudnn.csv && rm -f raw.csv sass_prefill.csv sass_cudnn.csv

# ---- command 7: the Gluon kernel with copies a step ahead, 2 and 3 slots (gtree: 7e20ee2 + the candidate)
out=$1
mkdir -p /tmp/G && tar xzf .devrun/gtree.tgz -C /tmp/G && cp .devrun/gluon_check.py /tmp/G/
cd /tmp/G
export PYTHONPATH=/tmp/site:/tmp/G
for m in mimic mimic:3; do echo "check $m"; timeout 120 python3 gluon_check.py $m 2>&1 | grep -v -i warn | tr -d '\n ' | tail -c 1500; echo; done
for i in 1 2; do
timeout 240 python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,16x512 \
  --config '{}' --config '{"gluon": "mimic"}' --config '{"gluon": "mimic:3"}' \
  --output-json $out/sweep_mimic_$i.json 2>&1 | grep -v -i warn | grep -o "^[0-9]* x [0-9]*.*sdpa.*\|'gluon': [a-zA-Z0-9:\"']*, 'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*"
done

# ---- command 8: the same, with the second half's scores over the first half's softmax ("mimic2")
out=$1
mkdir -p /tmp/G && tar xzf .devrun/gtree.tgz -C /tmp/G && cp .devrun/gluon_check.py /tmp/G/
cd /tmp/G
export PYTHONPATH=/tmp/site:/tmp/G
for m in mimic2; do echo "check $m"; timeout 120 python3 gluon_check.py $m 2>&1 | grep -v -i warn | tr -d '\n ' | tail -c 1500; echo; done
for i in 1 2; do
timeout 240 python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576,16x512,4x2048,1x2048,1x1024 \
  --config '{}' --config '{"gluon": "mimic"}' --config '{"gluon": "mimic2"}' \
  --output-json $out/sweep_mimic2_$i.json 2>&1 | grep -v -i warn | grep -o "^[0-9]* x [0-9]*.*sdpa.*\|'gluon': [a-zA-Z0-9:\"']*, 'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*"
done

# ---- command 9: the adopted tree (uncommitted, 7e20ee2 + this change): GPU tests, sweep, latency against transformers
out=$1
. benchmarks/scripts/runs.sh
timeout 200 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "prefill or gluon" 2>&1 | tail -3 | tee $out/kernel_tests.txt
timeout 200 python3 -m pytest tests/test_gpu.py -q -s -p no:cacheprovider -k "gluon" 2>&1 | grep -v -i warn | tail -4 | tee $out/gpu_test.txt
timeout 120 python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x32768,8x8192,1x8192@24576 \
  --config '{}' --config '{"gluon": false}' --output-json $out/sweep.json 2>&1 | grep -v -i warn | grep -o "^[0-9]* x [0-9]*.*sdpa.*\|'gluon': [a-zA-Z0-9:\"']*, 'ms': [0-9.]*, 'tflop_per_s': [0-9.]*\|rror.*"
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64)
run lat_gluon_1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
RAYGRID_PREFILL_CONFIG='{"gluon": false}' run lat_triton "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run lat_hf "${lat[@]}" --num-iters 2 --backend hf 2>&1 | grep -i "tpot\|exit" | head -4
run lat_gluon_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
cd $out && tar czf lat.tgz lat_* && rm -f lat_*

# ---- command 10: the new kernel test after the float16 tolerance fix; then two mutations of the kernel, each failing it
out=$1
timeout 150 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "gluon" 2>&1 | tail -3 | tee $out/kernel_tests_gluon.txt

# ---- the two mutations of command 10 (each on a fresh copy of the tree, run with `pytest tests/test_kernels.py -k gluon`):
# sed -i 's/        row_ahead = _tile_row(table_row, STAGES - 1, num_tiles, N, PAGE)/&  + PAGE/' raygrid/kernels/gluon_attention.py
# sed -i 's/v_tile.store(gl.where(gl.expand_dims(v_rows < seq_len, 1), v, gl.zeros_like(v)))/v_tile.store(v)/' raygrid/kernels/gluon_attention.py
