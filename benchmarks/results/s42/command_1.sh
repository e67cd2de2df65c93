#!/usr/bin/env bash
# Forty-second session, on any card: (1) the structured-output tests on a GPU after this session's change to the
# grammar masks' buffers (page-locked memory now reached as NumPy arrays kept by their tensors) and to the grammar
# compiler (llguidance's tokenizer built from the Rust tokenizer's JSON, not through llguidance.hf); (2) #21's cells:
# a 32k prompt against transformers with SDPA (raygrid, then transformers: TTFT, and raygrid's token at 32k against
# its floor), W1, then with the time left raygrid's 32k prompt again and W1 again.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
timeout $(left 130) python3 -m pytest -q tests/test_structured_outputs.py -k "every_grammar_kind or only_grammar or pickled" \
  > $R/grammar_tests.txt 2>&1; echo "grammar tests exit $?"; grep -E "passed|failed|FAILED|Error" $R/grammar_tests.txt | tail -6
lat() { timeout $(left $3) bash -c "$(declare -f rg run); out=$R; run $1 bench latency $2 --model random-qwen3-0.6b --dtype bfloat16 --input-len 32768" | grep -E "^input|exit"; }
w1() { timeout $(left $2) bash -c "$(declare -f rg run); out=$R; run $1 bench throughput --model random-qwen3-0.6b --num-prompts 256 ${w1[*]}" | grep -E "tok/s|exit" | head -3; }
lat lat_rg1 "--output-len 64 --num-iters 3" 250
lat lat_hf "--backend hf --output-len 16 --num-iters 2" 360
w1 w1_1 440
tar -czf $OUT/results.tgz -C $OUT r
[ $(left 570) -gt 70 ] && lat lat_rg2 "--output-len 64 --num-iters 3" 510
[ $(left 570) -gt 55 ] && w1 w1_2 570
tar -czf $OUT/results.tgz -C $OUT r
