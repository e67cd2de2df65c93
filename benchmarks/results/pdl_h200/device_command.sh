#!/usr/bin/env bash
# PDL A/B: batch-1 latency and W1 with RAYGRID_PDL=1 and 0, alternating; then GPU tests with PDL on
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
out=$R
for pdl in 1 0; do
  RAYGRID_PDL=$pdl timeout 80 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_pdl$pdl bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
done
for pdl in 1 0; do
  RAYGRID_PDL=$pdl timeout 70 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1_pdl$pdl bench throughput --model random-qwen3-0.6b ${w1[*]}"
done
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
for pdl in (1, 0):
    try:
        d = json.load(open(f"{R}/lat_pdl{pdl}.json"))
        for r in d["results"]:
            print("pdl", pdl, r["input_len"], "ttft", r["ttft_ms"]["median"], "tpot", round(r["tpot_ms"]["median"], 4), r["tpot_ms"].get("each"))
    except Exception as e:
        print("lat", pdl, "missing", e)
    try:
        print("pdl", pdl, "W1", json.load(open(f"{R}/w1_pdl{pdl}.json"))["output_tokens_per_s"])
    except Exception as e:
        print("w1", pdl, "missing", e)
PY
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1
echo "gpu tests exit $?"; tail -3 $R/gpu_tests.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "decode or skinny or rms or rotary or silu or store or sampling or gumbel" > $R/gpu_kernel_tests.txt 2>&1
echo "kernel tests exit $?"; tail -2 $R/gpu_kernel_tests.txt
true
