#!/usr/bin/env bash
# Twenty-eighth session, command 2 as it ran: on an H200, #21's goals first (command_3_h200_goals.sh); on any
# other card, the batch sweep (command_2.sh). $1: the commit.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash benchmarks/results/s28/command_3_h200_goals.sh "$1"
else
  bash benchmarks/results/s28/command_2.sh "$1"
fi
