#!/usr/bin/env bash
# Forty-second session, on any card: (1) the structured-output tests on a GPU after this session's change to the
# grammar masks' buffers (page-locked memory now reached as NumPy arrays kept by their tensors) and to the grammar
# compiler (llguidance's tokenizer built from the Rust tokenizer's JSON, not through llguidance.hf); (2) the
# shared-memory chain (benchmarks/scripts/persistent_decode_chain_smem.py: each stage's weights streamed into shared
# memory two stages ahead, 4 and 8 warps) against the Triton chain's best (registers, ordered sums, 8 warps) and the
# engine's kernels, us a layer, and each shared-memory way's timeline stage by stage (tile wait, product, last
# product, barrier); (3) #21's cells: a 32k prompt against transformers with SDPA (raygrid, then
# transformers: TTFT, and raygrid's token at 32k against its floor), then W1.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
timeout $(left 130) python3 -m pytest -q tests/test_structured_outputs.py -k "every_grammar_kind or only_grammar or pickled" \
  > $R/grammar_tests.txt 2>&1; echo "grammar tests exit $?"; grep -E "passed|failed|FAILED|Error" $R/grammar_tests.txt | tail -6
timeout $(left 220) python3 benchmarks/scripts/persistent_decode_chain_smem.py --output-json $R/chain_smem.json --timeline \
  > $R/chain_smem.txt 2>&1; echo "chain exit $?"; grep -E "^(engine|registers|smem)" $R/chain_smem.txt | cut -c1-400
tar -czf $OUT/results.tgz -C $OUT r
lat32k lat_rg1 "--output-len 64 --num-iters 3" 340
lat32k lat_hf "--backend hf --output-len 16 --num-iters 2" 450
w1run w1_1 540
tar -czf $OUT/results.tgz -C $OUT r
