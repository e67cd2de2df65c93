# Fifteenth session, command 3 (~200 s): where a batch-1 decode step at 32k goes, kernel by kernel (torch profiler
# over 10 steps, graph replays included), the layer-by-layer pass and the one-launch pass.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
R=$out/r; mkdir -p $R
for mode in default persistent; do
  extra=""; [ $mode = persistent ] && extra="--persistent-decode"
  timeout 150 python3 -c 'import sys; from raygrid.entrypoints.cli import main; sys.argv = ["raygrid"] + sys.argv[1:]; sys.exit(main())' bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 32768 --output-len 64 --num-iters 2 $extra --profile-dir $R/prof_$mode --output-json $R/lat_$mode.json > $R/lat_$mode.txt 2>&1; echo "$mode exit $?"; tail -4 $R/lat_$mode.txt
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['wall_ms_per_step'], d['gpu_busy_ms_per_step']); [print(round(k['us_per_step'],1), k['calls_per_step'], k['name'][:90]) for k in d['top_kernels'][:18]]" $R/prof_$mode/profile_decode_1x32768.json
done
cp .devrun/s15_c3.sh $R/device_command.sh
tar -C $out -czf $out/c3.tgz r && rm -rf $R
