#!/usr/bin/env bash
# Twenty-fourth session, the command that found no device time left, for the next session (an H200 if one comes:
# #21's targets are set there). The new defaults of the one-launch pass (32-key tiles at 5 attention stages, 8-row
# gate_up/down units, down_proj's K whole at Qwen3-0.6B's width) have run on a GPU only as a variant of
# persistent_decode_pass.py (same greedy token as the engine's pass, differences within the old default's): first the
# GPU suite with them, then the pass against the old defaults and with down_proj's K in slices of 1,024, then a lone
# request's latency new against old (RAYGRID_PERSISTENT_CONFIG) with transformers once, and W1.
# Carry [".devlite"] (benchmarks/scripts/device_bundle.sh builds it); results under $OUT/r, returned as one tarball.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-580} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout $(left 220) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py > $R/tests.txt 2>&1; echo "tests exit $? at $(( $(date +%s) - t0 )) s"; tail -3 $R/tests.txt
old='{"block_n": 64, "attention_stages": 2, "mlp_rows_per_unit": 16}'
(cd benchmarks/scripts && timeout $(left 290) python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant "$old" --variant '{"down_slice": 1024}' > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 2)
timeout $(left 345) bash -c "$(declare -f rg run); out=$R; run lat_new_1 ${lat[*]}" | grep -E "^input|exit"
RAYGRID_PERSISTENT_CONFIG="$old" timeout $(left 400) bash -c "$(declare -f rg run); out=$R; run lat_old_1 ${lat[*]}" | grep -E "^input|exit"
timeout $(left 455) bash -c "$(declare -f rg run); out=$R; run lat_new_2 ${lat[*]}" | grep -E "^input|exit"
timeout $(left 515) bash -c "$(declare -f rg run); out=$R; run lat_hf bench latency --backend hf --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 8192 32768 --num-iters 2" | grep -E "^input|exit"
timeout $(left 580) bash -c "$(declare -f rg run); out=$R; w1=(${w1[*]}); run w1 bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256" | tail -2
tar -czf $OUT/results.tgz -C $OUT r
