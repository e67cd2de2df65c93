#!/usr/bin/env bash
# Thirty-ninth session, the thirty-eighth's command_5.sh again with the chain's slices summed by atomic adds before
# each barrier (its first run, 1_chain_95724a8/, was held by every program folding all of y after it): can a
# persistent launch keep DRAM streaming through its grid barriers when its weights wait in shared memory? benchmarks/scripts/
# gluon_stream_chain.py: a chain of 56 GEMV layers (R x 1024 bf16 each, 16 rows a program) with a grid barrier after
# each, the unit read after the barrier, between arrival and wait (registers), or by bulk copies into a ring of 1 to
# 6 slots of shared memory (refilled once read, or only after the arrival); R = 4,096 (256 programs, two an SM: up to
# 3 slots) and R = 2,048 (128 programs, one an SM). Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"
timeout $(left 250) python3 benchmarks/scripts/gluon_stream_chain.py $R/chain_4096.json --rows 4096 --slots 1 2 3 \
  > $R/chain_4096.txt 2>&1; echo "4096 exit $?"; cut -c1-200 $R/chain_4096.txt | tail -12
timeout $(left 480) python3 benchmarks/scripts/gluon_stream_chain.py $R/chain_2048.json --rows 2048 --slots 1 2 3 4 6 \
  > $R/chain_2048.txt 2>&1; echo "2048 exit $?"; cut -c1-200 $R/chain_2048.txt | tail -16
tar -czf $OUT/results.tgz -C $OUT r
