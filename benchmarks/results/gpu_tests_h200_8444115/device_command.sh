# session 8 command 8: the GPU tests on the tree as it stands (last run whole at dab28a3; 4ad00de changed the Gluon dispatch since)
out=$1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader
timeout 280 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider --durations=5 2>&1 | grep -v -i warn | tail -12 | tee $out/kernel_tests.txt
timeout 290 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider --durations=5 2>&1 | grep -v -i warn | tail -14 | tee $out/gpu_tests.txt
