# Run on the warm H100 left by command_3.sh's exit (tree a01b7da, the new pass defaults), carry [".devlite"]:
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
mkdir -p $OUT/r; nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/r/gpu.txt
timeout 560 python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py > $OUT/r/gpu_suite.txt 2>&1
