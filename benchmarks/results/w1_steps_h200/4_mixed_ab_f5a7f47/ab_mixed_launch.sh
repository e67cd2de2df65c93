#!/usr/bin/env bash
# The two-stream mixed launch (triton_attention.MIXED_CONFIG), before it becomes the default, in one device command:
#   benchmarks/scripts/ab_mixed_launch.sh OUT [ROUNDS]
# 1. Its GPU tests: the kernel test, test_gpu's graphs-with-prefill cases (the graphs' engine with it off and on, against
#    the plain engine), and, with it on, the kernel-variant and async-scheduling tests.
# 2. #11's mixed step (mixed_step.py) and W1, alternating off (A) and on (B), ROUNDS times (default 2). One tree: the
#    switch is RAYGRID_MIXED_CONFIG, read when a process imports the kernels.
set -u
out=$1 rounds=${2:-2}
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
on='{"decode_rows_apart": true}'
tests() {  # NAME PYTEST_ARGS...
  local name=$1; shift
  python3 -m pytest -q -p no:cacheprovider "$@" > "$out/$name.txt" 2>&1; echo "$name: exit $?"; tail -1 "$out/$name.txt"
}
tests kernel_tests tests/test_kernels.py -k "mixed_batch or attention_launch or decode_attention or cached_prefix"
tests gpu_graph_tests tests/test_gpu.py -k graphs_of_steps_with_prefill
RAYGRID_MIXED_CONFIG="$on" tests gpu_tests_on tests/test_gpu.py -k "kernel_variants or async_scheduling_and_graphs"
for round in $(seq "$rounds"); do
  for side in A B; do
    if [ "$side" = B ]; then export RAYGRID_MIXED_CONFIG="$on"; else unset RAYGRID_MIXED_CONFIG; fi
    python3 benchmarks/scripts/mixed_step.py "$out/mixed_${side}_$round.json" > "$out/mixed_${side}_$round.log" 2>&1
    echo "mixed_${side}_$round: exit $?"; grep -E "^(decode|steady)" "$out/mixed_${side}_$round.log" | cut -c1-120
    run "w1_${side}_$round" bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
  done
done
unset RAYGRID_MIXED_CONFIG
