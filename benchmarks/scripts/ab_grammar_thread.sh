#!/usr/bin/env bash
# Where does structured output's step time go (issue #17)? One device command, three sides of structured_cost.py
# (random-qwen3-0.6b, 256 running, plain and JSON-schema rows twice each, alternating):
#   A  the tree as it is: the grammar thread advances the matchers and fills the masks;
#   B  the same with a 0.2 ms GIL switch interval (5 ms by default): how long the grammar thread waits for the GIL
#      between llguidance's calls while the step loop runs Python;
#   C  no grammar thread: the step loop advances and fills inline (llguidance still spreads each over its threads).
#   bash benchmarks/scripts/ab_grammar_thread.sh OUT
set -u
out=$1
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
rows=plain,json_schema,plain_again,json_schema_again
side() { name=$1; shift; echo "== $name"; timeout 150 python3 benchmarks/scripts/structured_cost.py "$out/structured_$name.json" --rows $rows "$@" > "$out/structured_$name.log" 2>&1; tail -1 "$out/structured_$name.log"; }
side A_grammar_thread
side B_switch_0.2ms --switch-interval 0.0002
f=raygrid/engine/structured_output.py
cp $f /tmp/structured_output.py
rewrite $f "def first_line(message: str) -> str:" "def _inline(fn, *args):
    done = Future()
    done.set_result(fn(*args))
    return done


def first_line(message: str) -> str:"
rewrite $f "return self._thread.submit(self._advance, items)" "return _inline(self._advance, items)"
rewrite $f "return self._thread.submit(self._fill, matchers, bitmask)" "return _inline(self._fill, matchers, bitmask)"
RAYGRID_GIT_COMMIT="${RAYGRID_GIT_COMMIT:-}+grammar_inline" side C_inline
cp /tmp/structured_output.py $f
