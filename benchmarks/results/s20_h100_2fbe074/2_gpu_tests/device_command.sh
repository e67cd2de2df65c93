#!/usr/bin/env bash
# Twentieth session, command 2, on the H100 of command 1 (warm), 2fbe074: the GPU suite.
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=2fbe074 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
timeout 500 python3 -m pytest -q -p no:cacheprovider tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py --durations=8 > $OUT/test_gpu.txt 2>&1
