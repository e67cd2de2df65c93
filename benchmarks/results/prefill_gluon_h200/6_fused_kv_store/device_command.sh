out=$1
. benchmarks/scripts/runs.sh
timeout 260 python3 -m pytest tests/test_gpu.py tests/test_kernels.py -q -p no:cacheprovider -k "not prefill_attention_with_cached_prefix and not fused_moe_under_each and not expert_parallel" 2>&1 | tail -6 | tee $out/gpu_tests.txt
mkdir -p /tmp/A && tar xzf .devrun/base_ad004ff.tgz -C /tmp/A
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64 --num-iters 3)
RAYGRID_GIT_COMMIT=ad004ff+fused-kv-store run lat_B1 "${lat[@]}"
(cd /tmp/A && RAYGRID_GIT_COMMIT=ad004ff run lat_A1 "${lat[@]}")
RAYGRID_GIT_COMMIT=ad004ff+fused-kv-store run lat_B2 "${lat[@]}"
cd $out && tar czf lat.tgz lat_* && rm -f lat_*
