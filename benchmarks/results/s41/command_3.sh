#!/usr/bin/env bash
# Forty-first session, on any card: each tensor's address read from the pass's pointer table a stage ahead
# (`table_ahead`) against the default, where a read ahead between a barrier's arrival and its wait first waited for its
# address: (1) the pass at 512, 8,192 and 32,768 tokens, the default and table_ahead, each twice, interleaved (each
# variant's bits against the default's and its greedy token against the engine's pass), and each launch's fixed part;
# (2) a lone request at 32k end to end, the default and table_ahead alternating; (3) the pass's tests (the option with
# and without the kv heads' waits); (4) both launches' barrier timelines at 512, with the time left.
# Carry [".devlite"]; results under $OUT/r. $1: the commit, $2: seconds to stay within (570 by default).
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
L=${2:-570}; TA='{"table_ahead": true}'
timeout $(left $((L * 30 / 100))) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 512 8192 32768 \
  --variant "$TA" --variant '{}' --variant "$TA" > $R/pass.txt 2>&1; echo "pass exit $?"
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt | cut -c1-160
python3 benchmarks/scripts/pass_excess.py $R/pass.json --json $R/excess.json | grep -E "launch|fixed" | tee $R/excess.txt
tar -czf $OUT/results.tgz -C $OUT r
for c in '{}' "$TA" '{}' "$TA"; do
  [ $(left $((L * 75 / 100))) -gt 60 ] || break
  export RAYGRID_PERSISTENT_CONFIG="$c"; n=$(echo "$c" | tr -dc a-z | head -c 12)
  timeout $(left $((L * 75 / 100))) bash -c "$(declare -f rg run); out=$R; run lat_${n:-default}_$RANDOM bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 3" | grep -E "^input|exit"
done
unset RAYGRID_PERSISTENT_CONFIG
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left $((L - 50))) python3 -m pytest -q -x tests/test_persistent_decode.py > $R/tests.txt 2>&1; echo "tests exit $?"; tail -2 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
if [ $(left $L) -gt 40 ]; then
  timeout $(left $L) python3 benchmarks/scripts/persistent_decode_pass.py $R/timeline.json --contexts 512 --timeline 5 \
    --variant "$TA" > $R/timeline.txt 2>&1; echo "timeline exit $?"
fi
tar -czf $OUT/results.tgz -C $OUT r
