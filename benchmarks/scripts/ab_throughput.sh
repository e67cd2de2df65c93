#!/usr/bin/env bash
# A/B offline throughput of two checkouts in one device command, alternating A B A B so drift hits both.
#   benchmarks/scripts/ab_throughput.sh BASE_DIR OUT_DIR [extra bench args...]
# BASE_DIR holds the older checkout (e.g. `git archive COMMIT | tar -x -C .base`); this checkout is B.
# Writes OUT_DIR/{base,head}_{1,2}.json and .log (INFO logs carry the KV pool size).
set -euo pipefail
base=$1; out=$2; shift 2
head=$(pwd)
# The commits, where known: BASE_COMMIT and HEAD_COMMIT (a device's copied tree may carry a stale .git).
declare -A COMMIT=(["$base"]="${BASE_COMMIT:-}" ["$head"]="${HEAD_COMMIT:-}")
w1=(--model random-qwen3-0.6b --dtype bfloat16 --num-prompts 256 --random-range 100 1024 --no-progress "$@")
bench() {  # checkout, output name, extra args
  local dir=$1 name=$2; shift 2
  (cd "$dir" && RAYGRID_GIT_COMMIT="${COMMIT[$dir]:-}" PYTHONPATH="$dir:${PYTHONPATH:-}" python3 -c '
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from raygrid.entrypoints.cli import main
sys.argv = ["raygrid", "bench", "throughput"] + sys.argv[1:]
sys.exit(main())' "${w1[@]}" "$@" --output-json "$out/$name.json" > "$out/$name.log" 2>&1) || { tail -30 "$out/$name.log"; return 1; }
  echo "== $name"; grep -E "KV cache|CUDA graphs|output tok/s" "$out/$name.log" | tail -4
}
for i in 1 2; do
  bench "$base" "base_$i"
  bench "$head" "head_$i"
done
# Sizing check: the new profile must let W1 run at 0.95 without running out of memory.
bench "$head" head_util095 --gpu-memory-utilization 0.95
