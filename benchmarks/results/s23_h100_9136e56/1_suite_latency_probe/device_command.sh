#!/usr/bin/env bash
# Twenty-third session, command 1 (9136e56): the GPU suite with the two sampling-input tests, batch-1 latency
# against transformers, the host profile of a lone decode, and the host parts of a decode step, 1ec3803 against HEAD.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=9136e56 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
bash .devlite/install.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout $(left 250) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py "tests/test_sampling.py::test_sampling_inputs_keep_a_steady_batchs_parameters_and_stage_them_again_when_it_changes" "tests/test_sampling.py::test_sampling_inputs_and_logprobs_do_not_wait_for_the_gpu" --durations=8 > $OUT/gpu_tests.txt 2>&1; echo "tests exit $? at $(( $(date +%s) - t0 )) s"; tail -14 $OUT/gpu_tests.txt | cut -c1-180
out=$OUT; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64)
timeout $(left 380) bash -c "$(declare -f rg run); out=$OUT; run lat_raygrid_1 ${lat[*]} --input-len 512 8192 32768 --num-iters 3 --profile-dir $OUT/prof"
timeout $(left 430) bash -c "$(declare -f rg run); out=$OUT; run lat_hf ${lat[*]} --input-len 8192 32768 --num-iters 2 --backend hf"
echo "latency done at $(( $(date +%s) - t0 )) s"
cd benchmarks/scripts
timeout $(left 500) python3 kv_read_probe.py $OUT/kv_read_probe.json > $OUT/kv_read_probe.log 2>&1; echo "kv probe exit $?"; grep -v "^{.case" $OUT/kv_read_probe.log | tail -3; python3 -c "import json; [print(r) for r in json.load(open('$OUT/kv_read_probe.json'))['results']]" 2>/dev/null | cut -c1-140
timeout $(left 530) python3 host_profile.py $OUT/host_profile_512.txt --model random-qwen3-0.6b > $OUT/host_profile.log 2>&1; echo "profile exit $?"; head -30 $OUT/host_profile_512.txt | cut -c1-160
for i in 1 2; do
  (cd ../../.devold && PYTHONPATH=/tmp/site:$PWD timeout $(left 560) python3 ../benchmarks/scripts/step_host_parts.py $OUT/parts_old_$i.json --model random-qwen3-0.6b > $OUT/parts_old_$i.log 2>&1; echo "old $i exit $?")
  timeout $(left 570) python3 step_host_parts.py $OUT/parts_new_$i.json --model random-qwen3-0.6b > $OUT/parts_new_$i.log 2>&1; echo "new $i exit $?"
done
echo "all done at $(( $(date +%s) - t0 )) s"
