#!/usr/bin/env bash
# W1 as an A/B in one device command: the engine of another commit (A, a `git archive REV raygrid` unpacked in
# BASE) against the working tree (B), alternating A B A B ..., the same arguments for both.
#   git archive REV raygrid | tar -x -C BASE
#   bash benchmarks/scripts/ab_w1.sh OUT BASE ROUNDS --model random-llama3-8b --num-prompts 256 --quantization fp8
# Each run writes OUT/w1_{A,B}_<round>.json and .log, labelled by RAYGRID_GIT_COMMIT and A_COMMIT.
# A runs from BASE, so that `python -c` (whose path starts at the working directory) imports BASE's raygrid.
set -u
out=$1 base=$2 rounds=$3
shift 3
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
commit=${RAYGRID_GIT_COMMIT:-}
(cd "$base" && python3 -c 'import raygrid, sys; print("A imports", raygrid.__file__)')
python3 -c 'import raygrid; print("B imports", raygrid.__file__)'
for round in $(seq "$rounds"); do
  (cd "$base" && RAYGRID_GIT_COMMIT="${A_COMMIT:-A}" run "w1_A_$round" bench throughput "${w1[@]}" "$@")
  RAYGRID_GIT_COMMIT="$commit" run "w1_B_$round" bench throughput "${w1[@]}" "$@"
done
