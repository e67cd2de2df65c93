#!/usr/bin/env bash
# Thirty-sixth session, with under 300 s of device time left: command_3.sh's most decisive parts first, for an H200
# only (exits at once on an H100). (1) kv_read_probe.py --quick --cases head tma (row gathers against bulk copies, no
# arithmetic); (2) the pass at 32,768 with 5 (the default), 7 and 9 attention stages. Carry [".devlite"]. $1: commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
grep -q H200 $R/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
(cd benchmarks/scripts && timeout 90 python3 kv_read_probe.py $R/kv_read_probe.json --quick --cases head tma > $R/kv_read_probe.log 2>&1; echo "probe exit $?")
cut -c1-150 $R/kv_read_probe.log
tar -czf $OUT/results.tgz -C $OUT r
timeout 150 python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 32768 \
  --variant '{"attention_stages": 7}' --variant '{"attention_stages": 9}' --variant '{}' > $R/pass.txt 2>&1
echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt || tail -5 $R/pass.txt | cut -c1-240
tar -czf $OUT/results.tgz -C $OUT r
