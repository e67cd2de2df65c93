#!/usr/bin/env bash
# The fault hunt of benchmarks/README.md ("The illegal memory access"), on one GPU:
#   benchmarks/scripts/gpu_fault_bisect.sh OUT
# 1. every GPU kernel test of the FP8 and attention kernels, then an engine, in one process;
# 2. if the engine fails, each group of those tests alone before an engine, to find the one that leaves the fault;
# 3. that group under compute-sanitizer's memcheck. Writes OUT/*.txt; prints the verdicts.
set -u
out=$1
mkdir -p "$out"
probe() { timeout "$1" python3 benchmarks/scripts/gpu_fault_bisect.py "$2" > "$out/$3.txt" 2>&1; grep -h "VERDICT\|passed\|failed" "$out/$3.txt" | tail -3; }
probe 200 "fp8 or linear or per_token or attention or store_kv" combined
grep -q "engine ok" "$out/combined.txt" && exit 0
culprit=""
for group in "store_kv" "decode_attention or decode_padding" "prefill" "fp8_kv_cache" "skinny_linear" \
             "fp8_linear_on_gpu" "per_token" "scale_fp8" "test_fp8.py and not kv_cache and not on_gpu"; do
  name=group_$(echo "$group" | tr -c 'a-z0-9_\n' '_' | cut -c1-40)
  probe 60 "$group" "$name"
  grep -q "engine FAILED" "$out/$name.txt" && culprit="$group" && break
done
[ -z "$culprit" ] && { echo "no single group faults"; exit 0; }
echo "== memcheck of [$culprit]"
timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider tests/test_fp8.py tests/test_kernels.py -k "$culprit" > "$out/memcheck.txt" 2>&1
grep -h "ERROR SUMMARY\|Invalid\|passed\|failed" "$out/memcheck.txt" | head -20
