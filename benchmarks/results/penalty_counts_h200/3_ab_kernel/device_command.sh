# Command 3: GPU tests of the fused penalties kernel and the device-held counts; W1 with penalties, old tree against
# new (alternating), and W1 plain on the new tree.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
R=$out/r; mkdir -p $R
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_sampling.py tests/test_kernels.py -k "penalties or wait_for_the_gpu or gumbel or bitmask" > $R/tests_kernels_sampling.txt 2>&1; echo "tests 1 exit $?"; tail -2 $R/tests_kernels_sampling.txt
pen='{"repetition_penalty": 1.1, "frequency_penalty": 0.1, "presence_penalty": 0.1}'
for i in 1 2; do
  (cd .devrun/old && out=$R && run w1_pen_old$i bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256 --sampling-params "$pen")
  (out=$R; run w1_pen_new$i bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256 --sampling-params "$pen")
done
(out=$R; run w1_plain_new bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256)
timeout 220 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/test_gpu.txt 2>&1; echo "test_gpu exit $?"; tail -3 $R/test_gpu.txt
cp .devrun/c3.sh $R/device_command.sh
tar -C $out -czf $out/c3.tgz r && rm -rf $R
