#!/usr/bin/env bash
# The GIL switch interval's effect on structured output's decode step (issue #17), inside each process: rows at
# 5 ms and at 0.2 ms alternate, in two processes (their runs have differed by tens of percent from one process
# to the next). RAYGRID_GRAMMAR_SWITCH_INTERVAL_S=0 keeps the engine from setting the interval itself.
#   bash benchmarks/scripts/ab_switch_interval.sh OUT
set -u
out=$1
mkdir -p "$out"
rows=plain@0.005,json_schema@0.005,json_schema@0.0002,json_schema_again@0.005,json_schema_again@0.0002,plain_again@0.0002
for process in 1 2; do
  echo "== process $process"
  RAYGRID_GRAMMAR_SWITCH_INTERVAL_S=0 timeout 150 python3 benchmarks/scripts/structured_cost.py "$out/switch_interval_$process.json" \
    --rows $rows > "$out/switch_interval_$process.log" 2>&1
  grep -h "switch interval\|decode step" "$out/switch_interval_$process.log"
done
