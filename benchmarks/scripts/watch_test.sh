#!/usr/bin/env bash
# Run a pytest selection with a deadline; if it is not done by then, dump the Python stacks of the test
# and of every Ray process (py-spy) before killing it, so that a hang on the device machine can be read.
#   benchmarks/scripts/watch_test.sh OUT DEADLINE_S pytest-args...
out=$1; deadline=$2; shift 2
python3 -m pytest -p no:cacheprovider "$@" > "$out/test.txt" 2>&1 &
pid=$!
for _ in $(seq "$deadline"); do kill -0 $pid 2>/dev/null || break; sleep 1; done
if kill -0 $pid 2>/dev/null; then
  for p in $pid $(pgrep -f "ray::"); do echo "=== $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-120)"; py-spy dump --pid "$p" 2>&1; done > "$out/stacks.txt"
  kill -9 $pid; pkill -9 -f "ray::"
  echo "deadline passed: stacks in $out/stacks.txt"
fi
wait $pid 2>/dev/null
tail -3 "$out/test.txt"
