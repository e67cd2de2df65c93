#!/usr/bin/env bash
# Twentieth session, command 3 (2fbe074 + KV_PREFETCH): attention's next tiles asked into L2 (prefetch.global.L2, a
# request a 128-byte line) a step or more ahead, in the one-launch pass and in the engine's decode launch that
# gathers rows (W1's). Built for sm_90 under Triton 3.6: the pass 255 registers, 38,912 B at 0, 1, 2, 4 tiles ahead;
# the decode launch 96 registers at 0, 122 at 2.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv,noheader
timeout 150 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass.json --contexts 512 8192 32832 --variant '{"kv_prefetch": 1}' --variant '{"kv_prefetch": 2}' --variant '{"kv_prefetch": 4}' > $out/pass.txt 2>&1; echo "pass exit $?"
python3 - $out/pass.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if k not in ("rows", "command")})
for r in d["rows"]:
    for v in r["variants"]:
        print(r["context"], v["variant"], round(v.get("us", 0), 1), {k: round(x, 2) for k, x in v.get("stage_us_one_pass", {}).items()}, v.get("same_argmax"), v.get("error", "")[:200])
PY
[ -s $out/pass.json ] || cut -c1-300 $out/pass.txt | tail -20
for round in 1 2; do
  timeout 70 bash -c "$(declare -f rg run); out=$out; w1=(${w1[*]}); run w1_base_$round bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256" | grep -v "^\s*$" | tail -2
  RAYGRID_DECODE_CONFIG='{"kv_prefetch": 2}' timeout 70 bash -c "$(declare -f rg run); out=$out; w1=(${w1[*]}); run w1_prefetch2_$round bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256" | grep -v "^\s*$" | tail -2
done
for f in $out/w1_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], round(d['output_tokens_per_s'], 1), [(w['kind'], w['seconds']) for w in d.get('where_the_time_goes', [])])" $f; done
cp .devrun/s20_b.sh $out/device_command.sh
