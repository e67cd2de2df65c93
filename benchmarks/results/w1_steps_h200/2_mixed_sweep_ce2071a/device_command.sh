#!/usr/bin/env bash
# Mixed steps' attention: the decode rows through the decode kernel while the prompts' kernel runs on a second stream.
cd "$(dirname "$0")/.."
R=$OUT/r
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
s=benchmarks/scripts/sweep_mixed_attention.py
echo "== #11's steady mix: 256 decodes at 576, 2 prompts of 512"
timeout 150 python3 $s --quick --decodes 256 --context 576 --prompts 2 --prompt-len 512 --output-json $R/mixed_256x576_2x512.json 2>&1 | tail -16
echo "== W1's prompt step: 150 decodes at 700, 14 prompts of 512"
timeout 150 python3 $s --quick --decodes 150 --context 700 --prompts 14 --prompt-len 512 --output-json $R/mixed_150x700_14x512.json 2>&1 | tail -16
echo "== 64 decodes at 1500, 1 prompt of 2048"
timeout 120 python3 $s --quick --decodes 64 --context 1500 --prompts 1 --prompt-len 2048 --output-json $R/mixed_64x1500_1x2048.json 2>&1 | tail -16
true
