#!/usr/bin/env bash
# Thirty-seventh session: gate_up_proj's unit size again, now that each unit's tiles are asked for a unit ahead
# (mlp_ahead, the default): 2, 3, 6 and 8 rows a unit (down_proj kept at 4) against the default's 4, each twice,
# interleaved with the default, at 512, 8,192 and 32,768 tokens. Any card. Carry [".devlite"]; $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
V=(--variant '{"mlp_rows_per_unit": 2, "down_rows_per_unit": 4}' --variant '{"mlp_rows_per_unit": 3, "down_rows_per_unit": 4}'
   --variant '{"mlp_rows_per_unit": 6, "down_rows_per_unit": 4}' --variant '{"mlp_rows_per_unit": 8, "down_rows_per_unit": 4}')
timeout 300 python3 benchmarks/scripts/persistent_decode_pass.py $R/pass_units.json --contexts 512 8192 32768 \
  "${V[@]}" --variant '{}' "${V[@]}" --variant '{}' > $R/pass_units.txt 2>&1
echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass_units.json > $R/passsum_units.txt
cut -c1-120 $R/passsum_units.txt
tar -czf $OUT/results.tgz -C $OUT r
