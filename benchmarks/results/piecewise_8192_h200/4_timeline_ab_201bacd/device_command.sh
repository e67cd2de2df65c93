# Fifteenth session, command 4 (~400 s): W1's steps with prompt tokens (8,192 tokens, run eagerly: the piecewise
# graphs stop at 2,048) took 36 ms each in command 2's plain runs, 24 to 28 in its logprobs runs, against about 20 ms
# of GPU work in the 7c9f882 profile. Host or GPU, step by step (w1_step_timeline.py) on this tree; then the same
# tree with piecewise graphs up to the step budget (B) against it (A, .devrun/base), W1 alternating, and B's timeline.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
R=$out/r; mkdir -p $R
timeout 110 python3 benchmarks/scripts/w1_step_timeline.py $R/timeline_A.json > $R/timeline_A.txt 2>&1; echo "timeline A exit $?"; head -23 $R/timeline_A.txt | cut -c1-330
rewrite raygrid/engine/piecewise_graphs.py "MAX_TOKENS = 2048" "MAX_TOKENS = 8192"
A_COMMIT=201bacd RAYGRID_GIT_COMMIT=201bacd+pieces8192 timeout 230 bash benchmarks/scripts/ab_w1.sh $R/ab .devrun/base 2 --model random-qwen3-0.6b --num-prompts 256
for f in $R/ab/w1_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); w=d['where_the_time_goes'][0]; print(sys.argv[1].split('/r/')[1], round(d['output_tokens_per_s'], 1), w['seconds'], [round(e['ms']) for e in w['each']])" $f; done
timeout 110 python3 benchmarks/scripts/w1_step_timeline.py $R/timeline_B.json > $R/timeline_B.txt 2>&1; echo "timeline B exit $?"; head -23 $R/timeline_B.txt | cut -c1-330
cp .devrun/s15_c4.sh $R/device_command.sh
tar -C $out -czf $out/c4.tgz r && rm -rf $R
