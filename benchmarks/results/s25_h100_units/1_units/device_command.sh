#!/usr/bin/env bash
# Twenty-fifth session: units of gate_up_proj and down_proj that fill the programs evenly (rows and slices of K that
# are not powers of 2, each read in a tile of the next one). First the one-launch pass's GPU tests (one launch has
# such units, with every program of the grid), then persistent_decode_pass.py over the variants, then the fastest
# variant at 32,832 against the default end to end (bench latency, alternating: default, best, default).
# Carry [".devlite"]; results under $OUT/r, returned as one tarball. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-520} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout $(left 110) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py -k "one_launch or persistent_decode" > $R/tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - t0 )) s"; tail -2 $R/tests.txt
(cd benchmarks/scripts && timeout $(left 300) python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant '{"mlp_rows_per_unit": 12}' \
  --variant '{"down_rows_per_unit": 8, "down_slice": 1536}' \
  --variant '{"mlp_rows_per_unit": 12, "down_rows_per_unit": 8, "down_slice": 1536}' \
  --variant '{"mlp_rows_per_unit": 12, "down_rows_per_unit": 16, "down_slice": 768}' \
  --variant '{"mlp_rows_per_unit": 12, "down_rows_per_unit": 4, "down_slice": 3072}' \
  > $R/pass.log 2>&1; echo "pass exit $? at $(( $(date +%s) - t0 )) s")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt
best=$(python3 - $R/pass.json <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
long = [v for v in rows[-1]["variants"] if "us" in v and v.get("same_argmax")]
print(json.dumps(min(long, key=lambda v: v["us"])["variant"]))
PY
)
echo "best at 32,832: $best"
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 2)
timeout $(left 385) bash -c "$(declare -f rg run); out=$R; run lat_default_1 ${lat[*]}" | grep -E "^input|exit"
RAYGRID_PERSISTENT_CONFIG="$best" timeout $(left 450) bash -c "$(declare -f rg run); out=$R; run lat_best ${lat[*]}" | grep -E "^input|exit"
timeout $(left 515) bash -c "$(declare -f rg run); out=$R; run lat_default_2 ${lat[*]}" | grep -E "^input|exit"
tar -czf $OUT/results.tgz -C $OUT r
