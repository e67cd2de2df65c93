#!/usr/bin/env bash
# Fortieth session, on any card: attention's and o_proj's units waiting for their own kv heads (`head_waits`) instead
# of two of a layer's five grid barriers: (1) the pass at 512, 8,192 and 32,768 tokens, the default and head_waits,
# each twice, interleaved; (2) both launches' barrier timelines at 512 and 32,768; (3) the pass's GPU tests (every
# launch against the model's pass, head_waits among them); (4) the thirty-ninth session's Gluon chain timeline
# (s39/command_5.sh) if time is left. On an H200, (1) also times the attention stage's depth (7 stages; 64-key tiles). Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"
HW='{"head_waits": true}'
V=(--variant "$HW" --variant '{}' --variant "$HW")
# On an H200 also the attention stage's depth, never swept there (the thirty-seventh session's command_3.sh)
grep -q H200 $R/gpu.txt && V+=(--variant '{"attention_stages": 7}' --variant '{"block_n": 64, "attention_stages": 5}')
timeout $(left 260) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 512 8192 32768 \
  "${V[@]}" > $R/pass.txt 2>&1; echo "pass exit $?"
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt | cut -c1-160
python3 benchmarks/scripts/pass_excess.py $R/pass.json --json $R/excess.json | grep -E "launch|fixed" | tee $R/excess.txt
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left 330) python3 -m pytest -q -x tests/test_persistent_decode.py > $R/tests.txt 2>&1; echo "tests exit $?"; tail -3 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left 450) python3 benchmarks/scripts/persistent_decode_pass.py $R/timeline.json --contexts 512 32768 --timeline 5 \
  --variant "$HW" > $R/timeline.txt 2>&1; echo "timeline exit $?"
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
if [ $(left 570) -gt 100 ]; then
  mkdir -p $R/chain; R0=$R; R=$R/chain
  timeout $(left 560) python3 benchmarks/scripts/gluon_stream_chain.py $R/chain_4096.json --rows 4096 --slots 1 3 --timeline \
    > $R/chain_4096.txt 2>&1; echo "chain exit $?"; R=$R0
fi
tar -czf $OUT/results.tgz -C $OUT r
