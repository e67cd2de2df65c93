#!/usr/bin/env bash
# Thirty-seventh session. On any card: the one-launch pass at 512, 8,192 and 32,768 tokens, the default against
# mlp_ahead (gate_up_proj's next unit's tiles asked for before the current one's are summed) alone and with gate's and
# up's first tiles read ahead of the barrier's wait (preload 15, 31), each twice, interleaved; pass_excess.py on the
# record (the part of the pass's excess over its floor present at 512, and the part that grows). On an H200 also:
# the attention stage's depth at 32k (7 and 9 stages, two 64-key tiles) and kv_read_probe.py --quick --cases head tma.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" | tee -a $R/gpu.txt
A=(--variant '{"mlp_ahead": true}' --variant '{"mlp_ahead": true, "preload": 15}' --variant '{"mlp_ahead": true, "preload": 31}')
timeout $(left 330) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass_ahead.json --contexts 512 8192 32768 \
  "${A[@]}" --variant '{}' "${A[@]}" --variant '{}' > $R/pass_ahead.txt 2>&1
echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass_ahead.json | tee $R/passsum_ahead.txt || tail -14 $R/pass_ahead.txt | cut -c1-240
python3 benchmarks/scripts/pass_excess.py $R/pass_ahead.json --json $R/excess_ahead.json | grep -E "launch|fixed" | tee $R/excess_ahead.txt
tar -czf $OUT/results.tgz -C $OUT r
grep -q H200 $R/gpu.txt || exit 0
timeout $(left 480) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass_depth.json --contexts 512 32768 \
  --variant '{"attention_stages": 7}' --variant '{"attention_stages": 9}' --variant '{"block_n": 64, "attention_stages": 5}' > $R/pass_depth.txt 2>&1
echo "depth exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass_depth.json | tee $R/passsum_depth.txt
python3 benchmarks/scripts/pass_excess.py $R/pass_depth.json | grep -E "launch|fixed" | tee $R/excess_depth.txt
tar -czf $OUT/results.tgz -C $OUT r
(cd benchmarks/scripts && timeout $(left 565) python3 kv_read_probe.py $R/kv_read_probe.json --quick --cases head tma > $R/kv_read_probe.log 2>&1; echo "probe exit $?")
cut -c1-150 $R/kv_read_probe.log | tail -12
tar -czf $OUT/results.tgz -C $OUT r
