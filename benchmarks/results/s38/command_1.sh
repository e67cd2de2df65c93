#!/usr/bin/env bash
# Thirty-eighth session, on any card: the one-launch pass at 512, 8,192 and 32,768 tokens. (1) The tree, whose stage 3
# reads only the attention slices that hold keys, with its new knobs: slices of at least 64, 128 or 256 keys
# (slice_min), the slices' partial outputs in the model's dtype (half_parts), 16 slices a kv head; (2) the kernel as it
# was at 04c63a7 (every slice read), through --kernel-module; (3) the tree again, default and half_parts. pass_excess.py
# on each record. Carry [".devlite"]; results under $OUT/r. $1: the commit.
# pd_04c63a7.py was `git show 04c63a7:raygrid/kernels/persistent_decode.py`, put beside this script for the run and
# removed after it (the tree went back to that kernel).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-570} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r; S=benchmarks/results/s38
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" | tee -a $R/gpu.txt
P=benchmarks/scripts/persistent_decode_pass.py; C=(--contexts 512 8192 32768)
sum() { python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/$1.json > $R/sum_$1.txt 2>&1; cut -c1-160 $R/sum_$1.txt
        python3 benchmarks/scripts/pass_excess.py $R/$1.json | grep -E "launch|fixed" | cut -c1-160; }
timeout $(left 300) python3 $P $R/new.json "${C[@]}" --variant '{"half_parts": true}' --variant '{"slice_min": 64}' \
  --variant '{"slice_min": 128}' --variant '{"slice_min": 256}' --variant '{"splits": 16}' \
  --variant '{"slice_min": 128, "half_parts": true}' --variant '{}' > $R/new.txt 2>&1; echo "new exit $?"; sum new
tar -czf $OUT/results.tgz -C $OUT r
PYTHONPATH=$PYTHONPATH:$S timeout $(left 390) python3 $P $R/old.json "${C[@]}" --kernel-module pd_04c63a7 --variant '{}' \
  > $R/old.txt 2>&1; echo "old exit $?"; sum old
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left 480) python3 $P $R/new2.json "${C[@]}" --variant '{"half_parts": true}' --variant '{}' > $R/new2.txt 2>&1
echo "new2 exit $?"; sum new2
tar -czf $OUT/results.tgz -C $OUT r
