# Device commands of this section (2026-12-04, sixth session), one H200. Each ran as:
#   mkdir -p /tmp/site/ray; bash .device/install.sh; export PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=<tree> ...; bash .devrun/<script> $OUT
# .devrun/ab_const.py (commands 3 to 5) was the first form of benchmarks/scripts/ab_gluon_constexpr.py: the same cases,
# rounds and timing, with the launch of gluon_attention.paged_attention_prefill written out in the script (and the
# head_groups argument of 1a038f2) and one switch, False then True; `ab_gluon_constexpr.py --variant '{"LAZY": true}'`
# reproduces it on a tree with the candidate diff. .devrun/l2_skinny.py is now benchmarks/scripts/skinny_l2_chains.py;
# .devrun/ncu_order.py is ncu_head_groups.py. Trees: 1a038f2 (head_groups), and it with each candidate diff for 3 to 5; e22a486 for 7.

# session 6 command 1: head-group program order for the Gluon prompt kernel: kernel test, sweep x2, ncu, engine TTFT
out=$1
. benchmarks/scripts/runs.sh
timeout 150 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "gluon_kernel_and_match or head_groups" 2>&1 | grep -v -i warn | tail -3 | tee $out/1_kernel_tests.txt
for i in 1 2; do
timeout 200 python3 benchmarks/scripts/sweep_prefill_attention.py --page 64 --cases 1x8192,1x16384,1x32768,8x8192,1x8192@8192,1x8192@16384,1x8192@24576 \
  --config '{}' --config '{"head_groups": 2}' --config '{"head_groups": 4}' --config '{"head_groups": 8}' --output-json $out/1_sweep_order_$i.json > $out/sweep_$i.log 2>&1; echo "sweep $i exit $?"
done
python3 - $out <<'PY'
import json, sys, glob, collections
rows = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/1_sweep_order_*.json")):
    for r in json.load(open(f))["results"]:
        key = (r["seqs"], r["len"], r.get("prefix", 0))
        rows[key].append((r.get("head_groups", "sdpa") if r["kernel"] == "raygrid" else "sdpa", r.get("tflop_per_s"), r.get("max_abs_error"), r.get("error")))
best = {}
for key, vals in rows.items():
    print(key, vals)
json.dump({str(k): v for k, v in rows.items()}, open(sys.argv[1] + "/summary.json", "w"))
PY
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 200 $NCU --clock-control none --nvtx --nvtx-include "measured/" --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  python3 .devrun/ncu_order.py > $out/1_ncu_order.txt 2>&1; echo "ncu exit $?"; grep -v "^==PROF==" $out/1_ncu_order.txt | grep "prefill\|duration\|hit_rate\|bytes\|pct" | head -60
G=$(python3 - $out <<'PY'
import json, sys, glob, collections
acc = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/1_sweep_order_*.json"):
    for r in json.load(open(f))["results"]:
        if r["kernel"] == "raygrid" and r.get("prefix") == 24576 and "tflop_per_s" in r:
            acc[r["head_groups"]].append(r["tflop_per_s"])
mean = {g: sum(v) / len(v) for g, v in acc.items()}
g = max(mean, key=mean.get)
print(g if mean[g] > 1.01 * mean[1] else 1)
PY
)
echo "best head_groups: $G"
if [ "$G" != "1" ]; then
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64)
run lat_g1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
RAYGRID_PREFILL_CONFIG="{\"head_groups\": $G}" run lat_g$G "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run lat_hf "${lat[@]}" --num-iters 2 --backend hf 2>&1 | grep -i "tpot\|exit" | head -4
RAYGRID_PREFILL_CONFIG="{\"head_groups\": $G}" run lat_g${G}_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
cd $out && tar czf 1_latency.tgz lat_* && rm -f lat_*
fi

# session 6 command 2: the Gluon kernel without its softmax (PROBE=1: products and copies alone), and Nsight Compute stalls of the Gluon kernel at 1 x 8,192
out=$1
timeout 150 python3 .devrun/probe.py $out/2_probe.json 2>&1 | grep -v -i warn
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 300 $NCU --clock-control none --nvtx --nvtx-include "measured/" --launch-skip 1 --launch-count 1 -k regex:_prefill_kernel \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
  --import-source no -o $out/prefill python3 benchmarks/scripts/ncu_prefill_case.py > $out/ncu_log.txt 2>&1; echo "ncu exit $?"; tail -3 $out/ncu_log.txt
$NCU --import $out/prefill.ncu-rep --page details > $out/2_ncu_details.txt 2>&1
grep -n "prefill_kernel\|Duration\|Throughput\|Stall\|Warp Cycles\|Issued\|Eligible\|Registers\|Pipe\|Busy\|Hit" $out/2_ncu_details.txt | head -60
$NCU --import $out/prefill.ncu-rep --page source --print-source sass --csv -k regex:_prefill_kernel > $out/sass.csv 2>&1; echo "src $?"
python3 benchmarks/scripts/ncu_stalls.py $out/sass.csv --top 30 > $out/2_stalls.txt 2>&1; head -70 $out/2_stalls.txt
cd $out && tar czf 2_ncu.tgz prefill.ncu-rep sass.csv && rm -f prefill.ncu-rep sass.csv

# ---- command 3 (tree: 1a038f2 + dropped_row_trees.diff)
timeout 240 python3 .devrun/ab_const.py $out/3_ab_tree.json TREE 2>&1 | grep -v -i warn

# ---- command 4 (tree: 1a038f2 + probe_without_softmax.diff)
timeout 240 python3 .devrun/ab_const.py $1/4_ab_probe.json PROBE 2>&1 | grep -v -i warn

# ---- command 5 (tree: 1a038f2 + dropped_lazy_rescale.diff)
timeout 240 python3 .devrun/ab_const.py $1/5_ab_lazy.json LAZY 2>&1 | grep -v -i warn

# ---- command 6 (tree: 1a038f2)
timeout 120 python3 .devrun/l2_skinny.py $1/6_l2_skinny.json 2>&1 | grep -v -i warn

# session 6 command 7: skinny kernel's L2 prefetch before the PDL wait: kernel tests, 28-launch chains, batch-1 latency A/B
out=$1
. benchmarks/scripts/runs.sh
timeout 200 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "skinny or linear" 2>&1 | grep -v -i warn | tail -3 | tee $out/7_kernel_tests.txt
for p in 0 1; do echo "chains, prefetch $p"; RAYGRID_SKINNY_PREFETCH=$p timeout 120 python3 .devrun/l2_skinny.py $out/7_chain_prefetch$p.json 2>&1 | grep -v -i warn; done
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3)
for i in 1 2; do
for p in 0 1; do
RAYGRID_SKINNY_PREFETCH=$p run lat_p${p}_$i "${lat[@]}" 2>&1 | grep -i "tpot\|exit" | head -4
done; done
cd $out && tar czf 7_latency.tgz lat_* && rm -f lat_*

# ---- command 8 (tree: dab28a3, the final tree)
# session 6 command 8 (the final tree): prefill/Gluon kernel tests and the engine's Gluon test; the two new scripts
# (skinny_l2_chains.py; ab_gluon_constexpr.py on the lazy-rescale candidate, in a copy of the tree with its diff)
out=$1
timeout 200 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "prefill or gluon" 2>&1 | grep -v -i warn | tail -3 | tee $out/8_kernel_tests.txt
timeout 200 python3 -m pytest tests/test_gpu.py -q -s -p no:cacheprovider -k "gluon" 2>&1 | grep -v -i warn | grep "Gluon against\|passed\|failed\|Error" | tail -5 | tee $out/8_gpu_tests.txt
timeout 90 python3 benchmarks/scripts/skinny_l2_chains.py --output-json $out/8_skinny_l2_chains.json 2>&1 | grep -v -i warn
rm -rf /tmp/G && mkdir -p /tmp/G && cp -r raygrid benchmarks /tmp/G/ && cd /tmp/G && patch -p1 -s < benchmarks/results/softmax_probes_h200/dropped_lazy_rescale.diff && echo patched
PYTHONPATH=/tmp/site:/tmp/G timeout 200 python3 benchmarks/scripts/ab_gluon_constexpr.py LAZY --output-json $out/8_ab_lazy.json 2>&1 | grep -v -i warn

# ---- command 9 (tree: abde4dc + dropped_eight_warps.diff; ab_gluon_constexpr.py with --variant, as committed after it)
# session 6 command 9: the Gluon kernel at 8 warps (two warp groups, 128 queries a head, shared K/V slots), 3 and 4 stages
out=$1
timeout 300 python3 benchmarks/scripts/ab_gluon_constexpr.py --variant '{"WARPS": 8, "STAGES": 4}' --variant '{"WARPS": 8, "STAGES": 3}' --output-json $out/9_ab_w8.json 2>&1 | grep -v -i warn

# ---- command 10 (tree: 349ca70, the final tree)
# session 6 command 10 (the final tree): 32k TTFT and TPOT against transformers in one command; W1 on the 0.6B
out=$1
. benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64)
run lat_1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run lat_hf "${lat[@]}" --num-iters 2 --backend hf 2>&1 | grep -i "tpot\|exit" | head -4
run lat_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "tpot\|exit" | head -4
run w1 bench throughput --model random-qwen3-0.6b --num-prompts 256 "${w1[@]}" 2>&1 | grep -i "tok/s\|exit" | head -4
cd $out && tar czf 10_latency_w1.tgz lat_* w1* && rm -f lat_* w1.*

# ---- command 11 (tree: 4ad00de, after the review)
# session 6 command 11: after the review's edit of the Gluon dispatch: the Gluon kernel tests and the engine's Gluon test
out=$1
timeout 200 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "gluon" 2>&1 | grep -v -i warn | tail -2 | tee $out/11_kernel_tests.txt
timeout 200 python3 -m pytest tests/test_gpu.py -q -s -p no:cacheprovider -k "gluon" 2>&1 | grep -v -i warn | grep "Gluon against\|passed\|failed\|Error" | tail -3 | tee $out/11_gpu_tests.txt
