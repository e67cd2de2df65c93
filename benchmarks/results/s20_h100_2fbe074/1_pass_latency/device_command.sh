#!/usr/bin/env bash
# Twentieth session, command 1 (2fbe074): the one-launch pass against the engine's, with attention tiles of 32 and 16
# keys whose extra pipeline stages keep two or three tiles in flight within today's shared memory (built offline for
# sm_90 under Triton 3.6: 64 keys 2 stages 38,912 B; 32 keys 5 stages 38,144 B; 32/7 54,656; 32/2 21,504; 16/7 29,376),
# then batch-1 latency at 8k and 32k: raygrid, transformers, raygrid.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv,noheader
timeout 170 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass.json --contexts 512 8192 32832 --variant '{"preload": 0}' --variant '{"block_n": 32, "attention_stages": 5}' --variant '{"block_n": 32, "attention_stages": 7}' --variant '{"block_n": 32}' --variant '{"block_n": 16, "attention_stages": 7}' > $out/pass.txt 2>&1; echo "pass exit $?"
python3 - $out/pass.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if k != "rows"})
for r in d["rows"]:
    for v in r["variants"]:
        print(r["context"], v["variant"], round(v.get("us", 0), 1), {k: round(x, 2) for k, x in v.get("stage_us_one_pass", {}).items()}, v.get("same_argmax"), v.get("error", "")[:200])
PY
[ -s $out/pass.json ] || cut -c1-300 $out/pass.txt | tail -20
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 8192 32768 --output-len 64)
timeout 130 bash -c "$(declare -f rg run); out=$out; run lat_raygrid_1 ${lat[*]} --num-iters 3"
timeout 110 bash -c "$(declare -f rg run); out=$out; run lat_hf ${lat[*]} --num-iters 2 --backend hf"
timeout 130 bash -c "$(declare -f rg run); out=$out; run lat_raygrid_2 ${lat[*]} --num-iters 3"
cp .devrun/s20_a.sh $out/device_command.sh
