#!/usr/bin/env bash
# Decode attention by bulk copies (TMA) over 64-token pages: GPU kernel tests, the decode sweep (gather vs bulk),
# W1 A/B alternating (RAYGRID_DECODE_CONFIG tma off = A, default on = B), batch-1 latency A/B, the mixed sweep.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "decode or bulk or fp8_kv or padded" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; grep -E "passed|failed|^FAILED|^ERROR" $R/kernel_tests.txt | tail -6
timeout 140 python3 benchmarks/scripts/sweep_decode_attention.py --tma --output-json $R/sweep_decode_tma.json > $R/sweep_decode_tma.txt 2>&1; echo "decode sweep $?"; cat $R/sweep_decode_tma.txt | tail -9
for name in w1_A1 w1_B1 w1_A2 w1_B2; do
  cfg='{}'; [[ $name == *A* ]] && cfg='{"tma": false}'
  RAYGRID_DECODE_CONFIG="$cfg" timeout 55 bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput --model random-qwen3-0.6b ${w1[*]}" | grep -E "exit|tok/s|Throughput" | head -3
done
L="bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
for name in A1 B1; do
  cfg='{}'; [[ $name == A* ]] && cfg='{"tma": false}'
  RAYGRID_DECODE_CONFIG="$cfg" timeout 55 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_$name $L" | grep exit
done
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
for name in ("A1", "B1"):
    try: d = json.load(open(f"{R}/lat_{name}.json"))
    except Exception as e: print(name, e); continue
    for r in d["results"]: print(name, r["input_len"], "ttft", r["ttft_ms"]["median"], "tpot", r["tpot_ms"]["median"], r["tpot_ms"]["each"], "over floor", round(r["tpot_over_floor"], 3))
PY
timeout 70 python3 benchmarks/scripts/sweep_mixed_attention.py --output-json $R/sweep_mixed_page64.json > $R/sweep_mixed_page64.txt 2>&1; echo "mixed sweep $?"; sort -k2 -n $R/sweep_mixed_page64.txt | head -5
true
