#!/usr/bin/env bash
# Thirty-ninth session: the thirty-eighth's command_5.sh again, on the chain as it stood at 2371c6d (each layer's
# slices summed by atomic adds before the barrier, where its first run, 1_chain_95724a8/, had every program fold all
# of y after it; the times did not move, so the fold was not what held the chain). Run inside command_4.sh.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
exec bash benchmarks/results/s38/command_5.sh "$1"
