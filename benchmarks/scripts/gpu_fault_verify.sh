#!/usr/bin/env bash
# After the fix of the memory profile's positions (benchmarks/README.md, "The illegal memory access"), on one GPU:
#   benchmarks/scripts/gpu_fault_verify.sh OUT [memcheck-only]
# 1. the kernel tests then an engine in one process (it faulted before the fix);
# 2. an engine alone under memcheck, as the tree is and with the fix undone (the rotary tables read past their end);
# 3. the 8-warp decode launches over an FP8 cache under memcheck (the sweep's other fault). Writes OUT/*.txt.
set -u
out=$1
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
if [ "${2:-}" != memcheck-only ]; then
  timeout 150 python3 benchmarks/scripts/gpu_fault_bisect.py "fp8 or linear or per_token or attention or store_kv" > "$out/combined.txt" 2>&1
  grep -h "VERDICT\|passed" "$out/combined.txt"
fi
# torch caches its allocations in segments, and memcheck sees only a read past a segment; without the cache it
# sees a read past any tensor (the rotary tables read past their end lay inside a segment).
memcheck() { PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 10 "$@"; }
memcheck python3 benchmarks/scripts/gpu_fault_bisect.py "" > "$out/memcheck_engine.txt" 2>&1
echo "engine, fixed:"; grep -h "VERDICT\|ERROR SUMMARY" "$out/memcheck_engine.txt"
cp raygrid/engine/model_runner.py /tmp/model_runner.py
rewrite raygrid/engine/model_runner.py " % self.config.model.max_model_len" ""
memcheck python3 benchmarks/scripts/gpu_fault_bisect.py "" > "$out/memcheck_engine_unfixed.txt" 2>&1
echo "engine, fix undone:"; grep -h "VERDICT\|ERROR SUMMARY" "$out/memcheck_engine_unfixed.txt"; grep -m3 -h "Invalid\|in _" "$out/memcheck_engine_unfixed.txt"
cp /tmp/model_runner.py raygrid/engine/model_runner.py
memcheck python3 benchmarks/scripts/fp8_decode_fault.py --eager-only --launches eight-warps > "$out/memcheck_fp8_decode_8warps.txt" 2>&1
echo "8-warp FP8 decode:"; grep -h "ERROR SUMMARY\|Error" "$out/memcheck_fp8_decode_8warps.txt" | head -5
