#!/usr/bin/env bash
# Batch-1 decode with fewer launches (decode slices combined by their last program; o_proj/down_proj adding the
# residual and normalizing, gate_up ending in SiLU-and-mul, each in its own launch). A = the tree before
# (.device/A, 091e17e), C = new. Then a profile of C, and the placement sweep.
cd "$(dirname "$0")/.."
R=$OUT/r; out=$R
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "decode_attention or skinny or padding_rows or bulk" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -3 $R/kernel_tests.txt
L="bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
lat() { name=$1; tree=$2; shift 2; (export PYTHONPATH=/tmp/site:$tree; [ "$tree" != "$PWD" ] && export RAYGRID_GIT_COMMIT=091e17e; timeout 75 bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name $L $*"); }
lat lat_A1 $PWD/.device/A
lat lat_C1 $PWD
lat lat_A2 $PWD/.device/A
mkdir -p $R/prof_C
lat lat_C2 $PWD --profile-dir $R/prof_C
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
for name in ("A1", "C1", "A2", "C2"):
    try: d = json.load(open(f"{R}/lat_{name}.json"))
    except Exception as e: print(name, e); continue
    for r in d["results"]: print(name, r["input_len"], "ttft", r["ttft_ms"]["median"], "tpot", r["tpot_ms"]["median"], r["tpot_ms"]["each"], r.get("tpot_over_floor"))
PY
for f in $R/prof_C/*.txt; do echo "== $(basename $f)"; head -16 $f | cut -c1-58,150-240; done
timeout 90 python3 benchmarks/scripts/sweep_decode_attention.py --placement --output-json $R/sweep_decode_placement.json > $R/sweep_decode_placement.txt 2>&1; echo "placement sweep $?"; grep -v Warn $R/sweep_decode_placement.txt | tail -6
true
