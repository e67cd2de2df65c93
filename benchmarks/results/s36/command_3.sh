#!/usr/bin/env bash
# Thirty-sixth session, for an H200 only (an H100 ran command 1's questions already; on one this exits at once):
# (1) command 1's depth variants of the one-launch pass, at 8k and 32k, each twice with the default between;
# (2) kv_read_probe.py, never run on an H200: how fast programs shaped like the pass's attention stage read a
# layer's cache with no arithmetic, by access shape, against a copy (on an H100 every shape read at the copy's rate),
# now also by bulk copies (its ``tma`` case, as the engine's decode launch reads; the pass gathers rows instead);
# (3) the split threshold sweep at 64, 96 and 128 decode rows.
# Carry [".devlite"]; results under $OUT/r. $1: the commit; $2 "short" (for a call with little device time left):
# each variant once, kv_read_probe.py --quick, the split at 96 and 128 rows only.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
grep -q H200 $R/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" | tee -a $R/gpu.txt
V=(--variant '{"attention_stages": 7}' --variant '{"attention_stages": 9}' --variant '{"kv_ahead": 2}' \
   --variant '{"attention_stages": 7, "kv_ahead": 2}' --variant '{"block_n": 64, "attention_stages": 5}' --variant '{}')
SHORT=$([ "$2" = short ] && echo 1); twice=("${V[@]}"); [ -n "$SHORT" ] && twice=()
timeout $(left 300) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 8192 32768 \
  "${V[@]}" "${twice[@]}" > $R/pass.txt 2>&1
echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt || tail -14 $R/pass.txt | cut -c1-240
tar -czf $OUT/results.tgz -C $OUT r
(cd benchmarks/scripts && timeout $(left 450) python3 kv_read_probe.py $R/kv_read_probe.json ${SHORT:+--quick} > $R/kv_read_probe.log 2>&1; echo "probe exit $?")
python3 -c "import json; [print({k: v for k, v in r.items() if k != 'error'}) for r in json.load(open('$R/kv_read_probe.json'))['results']]" 2>/dev/null | cut -c1-140
tar -czf $OUT/results.tgz -C $OUT r
for d in $([ -n "$SHORT" ] && echo 96 128 || echo 64 96 128); do
  [ $(left) -lt 40 ] && break
  timeout $(left) python3 benchmarks/scripts/sweep_mixed_attention.py --quick --decodes $d --context 700 --prompts 14 \
    --prompt-len 560 --output-json $R/split_d$d.json > $R/split_d$d.txt 2>&1
  echo "== $d decode rows (exit $?)"; grep -E "block_m=128 pack=2 block_n=64 warps=4 stages=3 tma=True|^split|^decode kernel alone" $R/split_d$d.txt | cut -c1-100
done
tar -czf $OUT/results.tgz -C $OUT r
