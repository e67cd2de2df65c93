# On the warm H100 left by command_3.sh's exit (tree 1d61a10), carry [".devlite"]:
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=1d61a10 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1; mkdir -p $OUT/r; R=$OUT/r; out=$R; . benchmarks/scripts/runs.sh
for i in 1 2; do timeout 100 bash -c "$(declare -f rg run); out=$R; run w1_$i bench throughput --model random-qwen3-0.6b --num-prompts 256 ${w1[*]}"; done
