#!/usr/bin/env bash
# Twenty-third session, the command that got no machine, as it would run on the final tree (4d3912e), with .devold
# holding `git archive 9136e56 raygrid` (before down_proj's slices of 1,024): the pass with gate_up/down in units
# of 8 rows against the default (16); the one-launch pass's GPU tests; a 32k token, old and new trees.
# Carry [".devlite", ".devold"] (benchmarks/scripts/device_bundle.sh builds .devlite).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=4d3912e PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-170} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
ls /tmp/site/msgspec >/dev/null 2>&1 || bash .devlite/install.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
(cd benchmarks/scripts && timeout $(left 60) python3 persistent_decode_pass.py $OUT/pass.json --contexts 512 32832 --variant '{"mlp_rows_per_unit": 8}' > $OUT/pass.log 2>&1; python3 ../../benchmarks/results/s23_h100_9136e56/passsum.py $OUT/pass.json)
echo "pass at $(( $(date +%s) - t0 )) s"
timeout $(left 115) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py -k "persistent or one_launch or grid" > $OUT/tests.txt 2>&1; echo "tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed" $OUT/tests.txt | tail -2
. benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 2)
(cd .devold && PYTHONPATH=/tmp/site:$PWD timeout $(left 142) bash -c "$(declare -f rg); rg ${lat[*]} --output-json $OUT/lat_old.json" 2>&1 | grep -E "^input"); echo "old"
timeout $(left 170) bash -c "$(declare -f rg); rg ${lat[*]} --output-json $OUT/lat_new.json" 2>&1 | grep -E "^input"; echo "new"
echo "done at $(( $(date +%s) - t0 )) s"
