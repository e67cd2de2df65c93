#!/usr/bin/env bash
# Decode TMA only where contexts are split (the default now), and the skinny kernel over row tiles: GPU kernel tests,
# the skinny sweep at 64/128/256 rows, W1 at the default (x2), W1 with the skinny kernel up to 256 rows (x2,
# alternating), batch-1 latency at the default.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "skinny or decode" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; grep -E "passed|failed|^FAILED|^ERROR" $R/kernel_tests.txt | tail -6
timeout 190 python3 benchmarks/scripts/sweep_skinny_linear.py --rows 64 128 256 --budget-s 160 --output-json $R/sweep_skinny_rows.json > $R/sweep_skinny_rows.txt 2>&1; echo "skinny sweep $?"; cat $R/sweep_skinny_rows.txt | grep -v Warn | tail -16
for name in w1_D1 w1_S1 w1_D2 w1_S2; do
  m=16; [[ $name == *S* ]] && m=256
  RAYGRID_SKINNY_MAX_M=$m timeout 55 bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput --model random-qwen3-0.6b ${w1[*]}" | grep -E "exit|tok/s" | head -3
  grep -E "decode, 128|decode, 256" $R/$name.log
done
L="bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
timeout 55 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_D $L" | grep exit
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
d = json.load(open(f"{R}/lat_D.json"))
for r in d["results"]: print("D", r["input_len"], "ttft", r["ttft_ms"]["median"], "tpot", r["tpot_ms"]["median"], r["tpot_ms"]["each"], "over floor", round(r["tpot_over_floor"], 3))
PY
true
