#!/usr/bin/env bash
# Thirty-seventh session: the Gluon prompt kernel with part of its exponentials on the FMA and integer units
# (prefill_parts.exp2_fma) against the default, in one process, alternating twice (ab_gluon_constexpr.py):
# FMA_EXP 1 (the second half's probabilities every step), 2 (on odd steps), 3 (both halves'). Any Hopper card.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
timeout 400 python3 benchmarks/scripts/ab_gluon_constexpr.py --variant '{"FMA_EXP": 1}' --variant '{"FMA_EXP": 2}' \
  --variant '{"FMA_EXP": 3}' --output-json $R/ab_fma_exp.json > $R/ab_fma_exp.txt 2>&1; echo "ab exit $?"
python3 - $R/ab_fma_exp.json <<'PY' | tee $R/ab_fma_exp_summary.txt
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
for r in rows:
    print(r["case"], r["variant"], r["tflop_per_s"], "err", round(r["max_abs_error"], 4))
PY
tail -3 $R/ab_fma_exp.txt | cut -c1-200
tar -czf $OUT/results.tgz -C $OUT r
