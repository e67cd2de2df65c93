# On the warm H100 left by command_3.sh's exit (tree a77ff93, the new pass defaults committed), carry [".devlite"]:
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=a77ff93 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1; mkdir -p $OUT/r; R=$OUT/r; out=$R; . benchmarks/scripts/runs.sh
timeout 170 bash -c "$(declare -f rg run); out=$R; run lat bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 8192 32768 --num-iters 3"
