#!/usr/bin/env bash
# PDL: the GPU tests with the wait removed (launch_pdl kept) must fail; batch-1 TPOT at 512, PDL off then on
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
cp raygrid/kernels/pdl.py /tmp/pdl.orig
rewrite raygrid/kernels/pdl.py "        tl.extra.cuda.gdc_wait()" "        pass  # broken on purpose: no wait"
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "float32_matches_cpu_path or cuda_graphs_match_eager" > $R/gpu_tests_no_wait.txt 2>&1
echo "broken (no wait) exit $? (must be 1)"; grep -E "^E  |passed|failed" $R/gpu_tests_no_wait.txt | cut -c1-200 | tail -4
cp /tmp/pdl.orig raygrid/kernels/pdl.py
out=$R
for pdl in 0 1; do
  RAYGRID_PDL=$pdl timeout 40 bash -c ". benchmarks/scripts/runs.sh; out=$R; run lat512_pdl${pdl}_second bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 --output-len 128 --num-iters 3"
done
true
