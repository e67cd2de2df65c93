#!/usr/bin/env bash
# cold start, second round: the fix (int32 profile tables, num_seqs/stride_bt unspecialized, the plain sampler profiled)
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
export TRITON_CACHE_DIR=/tmp/tcache_C; rm -rf $TRITON_CACHE_DIR; if false; then
timeout 150 python3 benchmarks/scripts/triton_compiles.py $R/compiles_C_cold.json > $R/compiles_C_cold.log 2>&1
echo "== C cold exit $?"; grep -E "wall_s|variants|compile_s|tok_s|Error" $R/compiles_C_cold.log; grep -A3 "^warmup +\|^run +" $R/compiles_C_cold.log | cut -c1-600 | head -30
fi; unset TRITON_CACHE_DIR
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k compiled_at_start > $R/gpu_test_compiles.txt 2>&1
echo "new test exit $?"; tail -2 $R/gpu_test_compiles.txt
cp raygrid/engine/model_runner.py /tmp/mr.orig
rewrite raygrid/engine/model_runner.py "first_block + blocks, dtype=torch.int32, device=device)" "first_block + blocks, device=device)"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k compiled_at_start > $R/gpu_test_compiles_broken_int64.txt 2>&1
echo "broken (int64 tables) exit $? (must be 1)"; grep -E "^E .*variants|passed|failed" $R/gpu_test_compiles_broken_int64.txt | cut -c1-300 | tail -3
cp /tmp/mr.orig raygrid/engine/model_runner.py
rewrite raygrid/engine/model_runner.py "        self.sampler(logits, dataclasses.replace(meta, **none, num_logprobs=[None] * rows))" "        pass"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k compiled_at_start > $R/gpu_test_compiles_broken_sampler.txt 2>&1
echo "broken (plain sampler not profiled) exit $? (must be 1)"; grep -E "^E .*variants|passed|failed" $R/gpu_test_compiles_broken_sampler.txt | cut -c1-300 | tail -3
cp /tmp/mr.orig raygrid/engine/model_runner.py
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k prefill > $R/gpu_kernel_prefill.txt 2>&1; echo "prefill kernel tests exit $?"; tail -1 $R/gpu_kernel_prefill.txt
cp raygrid/kernels/triton_attention.py /tmp/ta.orig
rewrite raygrid/kernels/triton_attention.py '@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])' '@triton.jit'
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k compiled_at_start > $R/gpu_test_compiles_broken_specialized.txt 2>&1
echo "broken (num_seqs specialized) exit $? (must be 1)"; grep -E "^E .*variants|passed|failed" $R/gpu_test_compiles_broken_specialized.txt | cut -c1-300 | tail -3
cp /tmp/ta.orig raygrid/kernels/triton_attention.py
