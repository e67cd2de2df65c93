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

# ---- p5.sh (the trace of one 32k request; results summarized in the README, trace not kept)
out=$1
python3 benchmarks/scripts/ttft_profile.py $out/trace32k --input-len 32768 --output-len 2 --variants default 2>&1 | grep "^default"
python3 - $out/trace32k/trace_default.json <<'PY' > $out/gaps.txt
import json, sys
t = json.load(open(sys.argv[1]))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
ev.sort(key=lambda e: e["ts"])
host = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "python_function")]
t0 = min(e["ts"] for e in t["traceEvents"] if "ts" in e and e.get("ph") == "X")
print("first GPU event at", ev[0]["ts"] - t0, "us after the first host event; last GPU end", max(e["ts"] + e["dur"] for e in ev) - t0)
busy = sum(e["dur"] for e in ev)
print("kernels", len(ev), "busy us", busy)
end = ev[0]["ts"]
gaps = []
for e in ev:
    if e["ts"] > end + 20:
        gaps.append((e["ts"] - end, end - t0, e["name"][:60]))
    end = max(end, e["ts"] + e["dur"])
gaps.sort(reverse=True)
print("total gaps > 20us:", sum(g[0] for g in gaps), "count", len(gaps))
for g in gaps[:25]:
    print(round(g[0]), "us gap at", round(g[1]), "before", g[2])
PY
cat $out/gaps.txt
cd $out && tar czf trace32k.tgz trace32k && rm -rf trace32k
