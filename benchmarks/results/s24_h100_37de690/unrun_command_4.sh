#!/usr/bin/env bash
# Twenty-fourth session, command 4 (the new defaults: 32-key tiles at 5 attention stages, 8-row gate_up/down units):
# the pass against the old defaults and with down_proj's K in slices of 1,024; the one-launch GPU tests (the engine
# with the pass against the engine without, every sampling parameter); a lone request's latency, new against old.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-270} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
ls /tmp/site/msgspec >/dev/null 2>&1 || bash .devlite/install.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
cp .devrun/s24_4.sh $R/device_command.sh
timeout $(left 80) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py -k "persistent or one_launch or grid" > $R/tests.txt 2>&1; echo "tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|Error" $R/tests.txt | tail -3
old='{"block_n": 64, "attention_stages": 2, "mlp_rows_per_unit": 16}'
(cd benchmarks/scripts && timeout $(left 150) python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant "$old" --variant '{"down_slice": 1024}' > $R/pass.log 2>&1; echo "pass exit $? at $(( $(date +%s) - t0 )) s")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 32768 --num-iters 2)
timeout $(left 210) bash -c "$(declare -f rg run); out=$R; run lat_new ${lat[*]}" | grep -E "^input|exit"
RAYGRID_PERSISTENT_CONFIG="$old" timeout $(left 270) bash -c "$(declare -f rg run); out=$R; run lat_old ${lat[*]}" | grep -E "^input|exit"
tar -czf $OUT/results.tgz -C $OUT r && rm -rf $R
echo "all done at $(( $(date +%s) - t0 )) s"
