# Next GPU session, command 1 (~500 s): the GPU tests of the thirteenth session's changes (penalties in the draw,
# logprobs without a [B, V] log-softmax, the memory profile's prompt passes, the capture/to_host twins), then
# W1 on an empty Triton cache (0 compiles during W1 expected).
out=$1; cd "$(dirname "$0")/.."; root=$PWD; . benchmarks/scripts/runs.sh
nvidia-smi -L > $out/gpu.txt; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $out/gpu.txt; git_commit=${RAYGRID_GIT_COMMIT:-}; echo "commit $git_commit" >> $out/gpu.txt
R=$out/r; mkdir -p $R
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "gumbel or penalties or logprob_stats or bitmask" tests/test_sampling.py > $R/tests_sampling.txt 2>&1; echo "sampling tests exit $?"; tail -3 $R/tests_sampling.txt
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_persistent_decode.py tests/test_graph_buffers.py > $R/test_gpu.txt 2>&1; echo "gpu tests exit $?"; tail -3 $R/test_gpu.txt
TRITON_CACHE_DIR=$(mktemp -d) timeout 120 python3 benchmarks/scripts/triton_compiles.py $R/triton_compiles.json > $R/triton_compiles.txt 2>&1; echo "compiles exit $?"; tail -5 $R/triton_compiles.txt
cp .devrun/s14_c1.sh $R/device_command.sh
tar -C $out -czf $out/c1.tgz r && rm -rf $R
