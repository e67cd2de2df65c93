#!/usr/bin/env bash
# W1's steps with prompt tokens: why 25 to 40 ms each. The step-by-step profile, then two plain W1 runs.
cd "$(dirname "$0")/.."
R=$OUT/r
out=$R
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 300 python3 benchmarks/scripts/profile_w1_prompts.py $R/profile_w1_prompts.json > $R/profile_w1_prompts.log 2>&1; echo "profile $?"; grep -v "^  " $R/profile_w1_prompts.log | tail -12
run w1_a bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
run w1_b bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
python3 - <<'PY'
import json, os
for n in ("w1_a", "w1_b"):
    d = json.load(open(os.environ["OUT"] + f"/r/{n}.json"))
    print(n, d["output_tokens_per_s"], [(s["ms"], s["tokens"], s["requests"]) for s in d["where_the_time_goes"][0]["each"]])
PY
true
