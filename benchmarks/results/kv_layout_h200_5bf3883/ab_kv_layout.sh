#!/usr/bin/env bash
# A/B in one device command: the KV cache stored "nhd" (A, a token's kv heads side by side) against "hnd" (B, each
# block's page of one kv head contiguous), set by RAYGRID_KV_LAYOUT. The kernels alone (sweep_kv_layout.py), the
# kernel tests over both layouts, then W1 on random-qwen3-0.6b alternating A, B, A, B, and the mixed step of #11.
#   bash benchmarks/scripts/ab_kv_layout.sh OUT [sweep] [tests] [w1] [mixed]
set -u
out=$1; shift
parts=${*:-sweep tests w1 mixed}
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
here=$(dirname "$0")
commit=${RAYGRID_GIT_COMMIT:-}
for part in $parts; do
  case $part in
    sweep) timeout 240 python3 "$here/sweep_kv_layout.py" --output-json "$out/sweep_kv_layout.json" > "$out/sweep_kv_layout.log" 2>&1
           echo "sweep exit $?"; cat "$out/sweep_kv_layout.log" | cut -c1-220 ;;
    tests) timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "store_kv or decode_attention or prefill_attention or fp8_kv" \
             > "$out/kernel_tests.txt" 2>&1; echo "tests exit $?"; tail -3 "$out/kernel_tests.txt" ;;
    w1) for round in 1 2; do
          RAYGRID_KV_LAYOUT=nhd RAYGRID_GIT_COMMIT="$commit+kv_nhd" run "w1_nhd_$round" bench throughput --model random-qwen3-0.6b "${w1[@]}"
          RAYGRID_KV_LAYOUT=hnd RAYGRID_GIT_COMMIT="$commit+kv_hnd" run "w1_hnd_$round" bench throughput --model random-qwen3-0.6b "${w1[@]}"
        done ;;
    mixed) for layout in nhd hnd; do
             RAYGRID_KV_LAYOUT=$layout RAYGRID_GIT_COMMIT="$commit+kv_$layout" timeout 150 python3 "$here/mixed_step.py" "$out/mixed_$layout.json" > "$out/mixed_$layout.log" 2>&1
             echo "mixed $layout exit $?"; tail -3 "$out/mixed_$layout.log"
           done ;;
  esac
done
