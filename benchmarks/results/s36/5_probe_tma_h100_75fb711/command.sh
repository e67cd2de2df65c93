#!/usr/bin/env bash
# Thirty-sixth session: command_4.sh 75fb711 (H200 only) found an H100 and ran nothing; on that warm H100 the probe's
# row gathers against its new bulk-copy case.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=75fb711 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH; mkdir -p $OUT/r; R=$OUT/r; [ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1; nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt; (cd benchmarks/scripts && timeout 150 python3 kv_read_probe.py $R/kv_read_probe.json --quick --cases head tma > $R/kv_read_probe.log 2>&1; echo "probe exit $?"); cut -c1-150 $R/kv_read_probe.log
