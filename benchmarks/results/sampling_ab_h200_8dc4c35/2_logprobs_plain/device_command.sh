# Fifteenth session, command 2 (~330 s): W1 with {"logprobs": 5}, 79b750a (.devrun/old) against this tree,
# alternating, 2 rounds; then plain W1 once each.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
R=$out/r; mkdir -p $R
A_COMMIT=79b750a timeout 220 bash benchmarks/scripts/ab_w1.sh $R/logprobs .devrun/old 2 --model random-qwen3-0.6b --num-prompts 256 --sampling-params '{"logprobs": 5}'
A_COMMIT=79b750a timeout 110 bash benchmarks/scripts/ab_w1.sh $R/plain .devrun/old 1 --model random-qwen3-0.6b --num-prompts 256
for f in $R/*/w1_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/r/')[1], round(d.get('output_throughput', d.get('output_tokens_per_s', 0)), 1))" $f; done
cp .devrun/s15_c2.sh $R/device_command.sh
tar -C $out -czf $out/c2.tgz r && rm -rf $R
