#!/usr/bin/env bash
# Thirty-ninth session, on any card: the one-launch pass's programs placed one an SM first (``sm_spread``, new, the
# default) against their ids (``{"sm_spread": false}``, as before), at 512, 2,048, 8,192 and 32,768 tokens, each
# twice, interleaved; then the Gluon chain (command_3.sh); then the barrier timeline at 512 and 32,768 both ways
# (the thirty-eighth's command_4.sh); then the pass's tests on the GPU (every launch against the model's pass). Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"
OFF='{"sm_spread": false}'
timeout $(left 200) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 512 2048 8192 32768 \
  --variant "$OFF" --variant '{}' --variant "$OFF" > $R/pass.txt 2>&1
echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json > $R/passsum.txt; cut -c1-120 $R/passsum.txt
tar -czf $OUT/results.tgz -C $OUT r
bash benchmarks/results/s39/command_3.sh "$1" | grep -E "exit|over_floor" | cut -c1-110
bash benchmarks/results/s38/command_4.sh "$1" "$OFF" | grep -v "^    \(qkv\|gate_up\|down\) "
timeout $(left 585) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py > $R/tests.txt 2>&1
echo "tests exit $?"; tail -3 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
