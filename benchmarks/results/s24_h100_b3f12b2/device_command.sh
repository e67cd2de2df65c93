#!/usr/bin/env bash
# Twenty-fourth session, command 1: the one-launch pass with later stages' inputs asked into L2 during each barrier
# (weights one or two barriers ahead, the first KV pages of each slice of the next attention stage), against the
# default; its GPU tests; then a lone request's latency at 512 and 32k with the best L2 variant at 32k, alternating
# with the default; the cache read probe on this card.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
bash .devlite/install.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
cp .devrun/s24_1.sh $OUT/device_command.sh
(cd benchmarks/scripts && timeout $(left 270) python3 persistent_decode_pass.py $OUT/pass.json --contexts 512 8192 32832 \
  --variant '{"l2_weights": 15, "l2_distance": 1}' --variant '{"l2_weights": 15, "l2_distance": 1, "l2_owned": true}' \
  --variant '{"l2_weights": 6, "l2_distance": 1, "l2_owned": true}' --variant '{"l2_weights": 15, "l2_distance": 2, "l2_owned": true}' \
  --variant '{"l2_kv_tiles": 2, "l2_kv_gap": 5}' --variant '{"l2_kv_tiles": 4, "l2_kv_gap": 5}' \
  --variant '{"l2_kv_tiles": 8, "l2_kv_gap": 4}' --variant '{"splits": 33}' --variant '{"splits": 33, "heads_per_slice": 2}' \
  --variant '{"splits": 33, "l2_weights": 6, "l2_owned": true, "l2_kv_tiles": 4, "l2_kv_gap": 5}' \
  --variant '{"l2_weights": 15, "l2_distance": 1, "l2_owned": true, "l2_kv_tiles": 4, "l2_kv_gap": 5}' --variant '{"mlp_rows_per_unit": 8}' > $OUT/pass.log 2>&1; echo "pass exit $? at $(( $(date +%s) - t0 )) s")
python3 - $OUT/pass.json $OUT/best.json <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no pass.json", e); json.dump({"l2_weights": 15, "l2_distance": 1, "l2_kv_tiles": 4, "l2_kv_gap": 5}, open(sys.argv[2], "w")); sys.exit()
for row in d["rows"]:
    for v in row["variants"]:
        s = v.get("stage_us_one_pass", {})
        print(row["context"], json.dumps(v["variant"]), round(v.get("us", 0), 1), {k: round(x, 2) for k, x in s.items()},
              v.get("same_argmax"), v.get("same_bits_as_default"), v.get("error", "")[:300])
last = d["rows"][-1]["variants"]
l2 = [v for v in last if "us" in v and v["variant"] and all(k.startswith("l2_") or k == "splits" for k in v["variant"])]
best = min(l2, key=lambda v: v["us"])["variant"] if l2 else {"l2_weights": 15, "l2_distance": 1}
print("best engine-settable variant at", d["rows"][-1]["context"], best); json.dump(best, open(sys.argv[2], "w"))
PY
best=$(cat $OUT/best.json)
timeout $(left 345) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py -k "persistent or one_launch or grid" > $OUT/tests.txt 2>&1; echo "tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|Error" $OUT/tests.txt | tail -3
out=$OUT; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 32768 --num-iters 2)
for i in 1 2; do
  timeout $(left $((345 + i * 110 - 55))) bash -c "$(declare -f rg run); out=$OUT; run lat_default_$i ${lat[*]}" | grep -E "^input|exit"
  RAYGRID_PERSISTENT_CONFIG="$best" timeout $(left $((345 + i * 110))) bash -c "$(declare -f rg run); out=$OUT; run lat_l2_$i ${lat[*]}" | grep -E "^input|exit"
done
echo "latency done at $(( $(date +%s) - t0 )) s"
for f in $OUT/lat_*.json; do python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], json.dumps(d)[:600])" $f; done
(cd benchmarks/scripts && timeout $(left 595) python3 kv_read_probe.py $OUT/kv_read_probe.json --quick > $OUT/kv_read_probe.log 2>&1; echo "probe exit $?"; tail -12 $OUT/kv_read_probe.log | cut -c1-160)
echo "all done at $(( $(date +%s) - t0 )) s"
