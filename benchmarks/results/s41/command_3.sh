#!/usr/bin/env bash
# Forty-first session, on any card: each tensor's address read from the pass's pointer table a stage ahead
# (`table_ahead`) against the default, where a read ahead between a barrier's arrival and its wait first waited for its
# address: (1) the pass's tests (the option with and without the kv heads' waits); (2) the pass at 512, 8,192 and
# 32,768 tokens, the default and table_ahead, each twice, interleaved, and each launch's fixed part; (3) both launches'
# barrier timelines at 512; (4) a lone request at 32k end to end, the default and table_ahead alternating.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
TA='{"table_ahead": true}'
timeout $(left 120) python3 -m pytest -q -x tests/test_persistent_decode.py > $R/tests.txt 2>&1; echo "tests exit $?"; tail -2 $R/tests.txt
timeout $(left 300) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 512 8192 32768 \
  --variant "$TA" --variant '{}' --variant "$TA" > $R/pass.txt 2>&1; echo "pass exit $?"
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt | cut -c1-160
python3 benchmarks/scripts/pass_excess.py $R/pass.json --json $R/excess.json | grep -E "launch|fixed" | tee $R/excess.txt
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left 400) python3 benchmarks/scripts/persistent_decode_pass.py $R/timeline.json --contexts 512 --timeline 5 \
  --variant "$TA" > $R/timeline.txt 2>&1; echo "timeline exit $?"
python3 - $R/timeline.json <<'PY' | tee $R/timeline_summary.txt | cut -c1-200
import json, sys
d = json.load(open(sys.argv[1]))
for row in d["rows"]:
    for v in row["variants"]:
        print(row["context"], json.dumps(v["variant"]), "us", round(v.get("us", 0), 1), v.get("error", ""))
        t = v.get("barrier_timeline") or {}
        for stage in ("qkv", "attention", "o_proj", "gate_up", "down"):
            if stage in t:
                print("   ", f"{stage:9}", " ".join(f"{k} {t[stage][k]:.2f}" for k in ("stage", "work", "work_max",
                      "last_arrival", "barrier")))
PY
tar -czf $OUT/results.tgz -C $OUT r
for c in '{}' "$TA" '{}' "$TA"; do
  [ $(left 570) -gt 75 ] || break
  export RAYGRID_PERSISTENT_CONFIG="$c"; n=$(echo "$c" | tr -dc a-z | head -c 12)
  timeout $(left 565) bash -c "$(declare -f rg run); out=$R; run lat_${n:-default}_$RANDOM bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 3" | grep -E "^input|exit"
done
tar -czf $OUT/results.tgz -C $OUT r
