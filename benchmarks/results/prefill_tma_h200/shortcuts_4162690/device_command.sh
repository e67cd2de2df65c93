#!/usr/bin/env bash
# TMA prefill: softmax shortcuts (bf16 exp2, lazy rescale) swept; GPU kernel tests; engine latency 512/32k with
# block 16 (before) / 64+TMA / 64+TMA+shortcuts / prefetch off, and transformers; W1 block 16 vs 64+TMA+shortcuts.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
out=$R
S=benchmarks/scripts/sweep_prefill_attention.py
C=1x32768,1x8192@24576
timeout 80 python3 $S --cases $C --page 64 --output-json $R/sweep.json \
  --config '{}' --config '{"fast_exp": true}' --config '{"lazy_rescale": true}' --config '{"fast_exp": true, "lazy_rescale": true}' \
  > $R/sweep.log 2>&1; echo "sweep $?"
python3 - <<'PY'
import json, os
d = json.load(open(f"{os.environ['OUT']}/r/sweep.json"))
for r in d["results"]:
    print(r.get("seqs"), r.get("len"), r.get("prefix"), r["kernel"], {k: r.get(k) for k in ("fast_exp","lazy_rescale","block_n","num_warps","num_stages")}, r.get("tflop_per_s"), r.get("max_abs_error"), r.get("error", "")[:120])
PY
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "prefill or bitmask or skinny" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -3 $R/kernel_tests.txt
L="bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_block16 $L --block-size 16"
timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_tma $L"
RAYGRID_PREFILL_CONFIG='{"fast_exp": true, "lazy_rescale": true}' timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_tma_fast $L"
RAYGRID_PDL_PREFETCH=0 timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_tma_noprefetch $L"
timeout 70 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_hf $L --backend hf --num-iters 2"
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
for name in ("lat_block16", "lat_tma", "lat_tma_fast", "lat_tma_noprefetch", "lat_hf"):
    try:
        for r in json.load(open(f"{R}/{name}.json"))["results"]:
            print(name, r["input_len"], "ttft", r["ttft_ms"]["median"], "tpot", round(r["tpot_ms"]["median"], 4), r["tpot_ms"].get("each"))
    except Exception as e:
        print(name, "missing", e)
PY
timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1_block16 bench throughput --model random-qwen3-0.6b ${w1[*]} --block-size 16"
RAYGRID_PREFILL_CONFIG='{"fast_exp": true, "lazy_rescale": true}' timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run w1_tma_fast bench throughput --model random-qwen3-0.6b ${w1[*]}"
true
