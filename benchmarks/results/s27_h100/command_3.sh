#!/usr/bin/env bash
# Twenty-seventh session, command 3: cuBLAS's products at 32 to 256 rows, weights from DRAM against weights in L2
# (benchmarks/scripts/cublas_l2_chains.py): the most that reading weights into L2 ahead could give a W1 step. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout 200 python3 benchmarks/scripts/cublas_l2_chains.py $R/cublas_l2.json --rows 32 64 128 192 256 2>&1 | python3 -c "
import json,sys
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l.rstrip()); continue
    print(r['rows'], 'layer dram %.2f l2 %.2f' % (r['layer_dram_us'], r['layer_l2_us']), {s: (min(r[s]['dram_us']).__round__(2), min(r[s]['l2_us']).__round__(2)) for s in ('qkv','o','gate_up','down')})"
tar -czf $OUT/results.tgz -C $OUT r
