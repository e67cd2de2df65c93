# Command 1: the GPU tests on the new tree (device-held penalty counts), then W1 with penalties, old tree (b33c1aa + the
# bench option) against new, alternating.
out=$1; cd "$(dirname "$0")/.."; root=$PWD; . benchmarks/scripts/runs.sh
nvidia-smi -L > $out/gpu.txt; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $out/gpu.txt
R=$out/r; mkdir -p $R
timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/test_sampling.py tests/test_graph_buffers.py > $R/tests_sampling_graph_buffers.txt 2>&1; echo "tests 1 exit $?"; tail -3 $R/tests_sampling_graph_buffers.txt
pen='{"repetition_penalty": 1.1, "frequency_penalty": 0.1, "presence_penalty": 0.1}'
for i in 1 2; do
  (cd .devrun/old && out=$R && run w1_pen_old$i bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256 --sampling-params "$pen")
  (out=$R; run w1_pen_new$i bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256 --sampling-params "$pen")
done
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/test_gpu.txt 2>&1; echo "test_gpu exit $?"; tail -3 $R/test_gpu.txt
tar -C $out -czf $out/c1.tgz r && rm -rf $R
