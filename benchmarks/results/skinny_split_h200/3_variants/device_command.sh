#!/usr/bin/env bash
# Why the split-K skinny configs + fused SiLU made batch-1 decode slower at 32k: four trees, each profiled.
# A = previous configs, separate SiLU; B = new configs + fused SiLU (the working tree); C = new configs, separate SiLU;
# D = previous configs + fused SiLU.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
CFG_NEW="    return dict(block_n=64 if n > 4096 else 32, block_k=128, split_k=4 if n <= 2048 else 1, num_warps=4, num_stages=4)"
CFG_OLD="    return dict(block_n=16 if n <= 2048 else 32, block_k=128, split_k=1, num_warps=4, num_stages=4)"
MLP_NEW="self.down_proj(ops.SiluAndMulInput(self.gate_up_proj(x)))"
MLP_OLD="self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))"
for t in A C D; do mkdir -p /tmp/$t && tar --exclude=./.device -cf - . | tar -C /tmp/$t -xf -; done
(cd /tmp/A && rewrite raygrid/kernels/triton_linear.py "$CFG_NEW" "$CFG_OLD" && rewrite raygrid/models/llama.py "$MLP_NEW" "$MLP_OLD")
(cd /tmp/C && rewrite raygrid/models/llama.py "$MLP_NEW" "$MLP_OLD")
(cd /tmp/D && rewrite raygrid/kernels/triton_linear.py "$CFG_NEW" "$CFG_OLD")
L="bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
for name in A B C D A2 B2; do
  dir=/tmp/${name:0:1}; [[ $name == B* ]] && dir=$PWD
  mkdir -p $R/prof_$name
  (cd $dir && PYTHONPATH=/tmp/site:$PWD timeout 75 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat_$name $L --profile-dir $R/prof_$name")
done
python3 - <<'PY'
import json, os
R = os.environ["OUT"] + "/r"
for name in ("A", "B", "C", "D", "A2", "B2"):
    try: d = json.load(open(f"{R}/lat_{name}.json"))
    except Exception as e: print(name, e); continue
    for r in d["results"]: print(name, r["input_len"], "ttft", r["ttft_ms"]["median"], "tpot", r["tpot_ms"]["median"], r["tpot_ms"]["each"])
PY
for name in A B C D; do for f in $R/prof_$name/*.txt; do echo "== $name $(basename $f)"; head -14 $f | cut -c1-60,150-230; done; done
true
