#!/usr/bin/env bash
# Twenty-fourth session, command 3: the pass with two 32-key tiles in flight (5 stages: the default's shared memory)
# and with 8-row gate_up/down units, each and both, against the default; a 32k prompt against transformers (SDPA) and
# a lone request's token on this tree; W1 twice.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $R/gpu.txt
cp .devrun/s24_3.sh $R/device_command.sh
(cd benchmarks/scripts && timeout $(left 130) python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant '{"block_n": 32, "attention_stages": 5}' --variant '{"mlp_rows_per_unit": 8}' \
  --variant '{"block_n": 32, "attention_stages": 5, "mlp_rows_per_unit": 8}' > $R/pass.log 2>&1; echo "pass exit $? at $(( $(date +%s) - t0 )) s")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768)
timeout $(left 200) bash -c "$(declare -f rg run); out=$R; run lat_raygrid ${lat[*]} --num-iters 3" | grep -E "^input|exit"
timeout $(left 290) bash -c "$(declare -f rg run); out=$R; run lat_hf ${lat[*]} --num-iters 2 --backend hf" | grep -E "^input|exit"
echo "latency done at $(( $(date +%s) - t0 )) s"
for i in 1 2; do
  timeout $(left $((290 + i * 80))) bash -c "$(declare -f rg run); out=$R; w1=(${w1[*]}); run w1_$i bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256" | tail -2
done
tar -czf $OUT/results.tgz -C $OUT r && rm -rf $R
echo "all done at $(( $(date +%s) - t0 )) s"
