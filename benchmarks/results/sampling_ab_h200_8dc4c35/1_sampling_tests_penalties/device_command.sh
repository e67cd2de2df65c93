# Fifteenth session, command 1 (~480 s): tests/test_sampling.py whole on a GPU (never run whole there since the
# thirteenth session's changes), then W1 with penalties, 79b750a (.devrun/old) against this tree, alternating, 2 rounds.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
nvidia-smi -L > $out/gpu.txt; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $out/gpu.txt; echo "commit ${RAYGRID_GIT_COMMIT:-}" >> $out/gpu.txt
R=$out/r; mkdir -p $R
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_sampling.py > $R/test_sampling.txt 2>&1; echo "sampling tests exit $?"; tail -3 $R/test_sampling.txt
A_COMMIT=79b750a timeout 280 bash benchmarks/scripts/ab_w1.sh $R/pen .devrun/old 2 --model random-qwen3-0.6b --num-prompts 256 --sampling-params '{"repetition_penalty": 1.1, "frequency_penalty": 0.1, "presence_penalty": 0.1}'
for f in $R/*/w1_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/r/')[1], round(d.get('output_throughput', d.get('output_tokens_per_s', 0)), 1))" $f; done
cp .devrun/s15_c1.sh $R/device_command.sh
tar -C $out -czf $out/c1.tgz r && rm -rf $R
