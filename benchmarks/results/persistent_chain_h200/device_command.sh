# Eighth session's six device commands (2026-12-04), one per commit of benchmarks/scripts/persistent_decode_chain.py
# (9698382, e11408f, 6bf062a, 5dd9548, fa59e74, e3d72fe: each JSON names its commit; the fifth and sixth added
# `--polls acquire`). Run on one H200 from the repository root as
#   mkdir -p /tmp/site/ray; bash .device/install.sh; export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 \
#     TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=<commit>; bash device_command.sh OUT
out=$1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 400 python3 benchmarks/scripts/persistent_decode_chain.py --output-json $out/persistent_chain.json 2>&1 | grep -v Warning | tail -30
