# Fifteenth session, command 5 (~380 s): piecewise graphs up to 8,192 tokens (every 512 past 2,048; mixed graphs
# still to 2,048) against 201bacd (.devrun/base), W1 once each, with each run's whole wall time (its start included);
# then the GPU tests of the graphs and the engine.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
R=$out/r; mkdir -p $R
for side in A B; do
  t0=$(date +%s.%N)
  if [ $side = A ]; then (cd .devrun/base && RAYGRID_GIT_COMMIT=201bacd run w1_A bench throughput "${w1[@]}" --model random-qwen3-0.6b --num-prompts 256)
  else RAYGRID_GIT_COMMIT=${RAYGRID_GIT_COMMIT} run w1_B bench throughput "${w1[@]}" --model random-qwen3-0.6b --num-prompts 256; fi
  echo "$side whole run $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" $t0 $(date +%s.%N)) s"
done 2>&1 | tee $R/w1_ab.txt
mv $out/w1_*.json $out/w1_*.log $R/ 2>/dev/null
for f in $R/w1_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); w=d['where_the_time_goes'][0]; print(sys.argv[1].split('/r/')[1], round(d['output_tokens_per_s'], 1), d['elapsed_s'], w['seconds'], d['memory'])" $f; done
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_graph_buffers.py > $R/test_gpu.txt 2>&1; echo "gpu tests exit $?"; tail -4 $R/test_gpu.txt
cp .devrun/s15_c5.sh $R/device_command.sh
tar -C $out -czf $out/c5.tgz r && rm -rf $R
