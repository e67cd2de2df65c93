# session 11 command 5 (the tree to commit: one-copy staging with kept views, graph-prepare guards, one-launch best chunk, attention-loop stages knob): GPU tests whole; bench latency at 512 and 32k; 512 against the old tree
out=$1
. benchmarks/scripts/runs.sh
timeout 250 python3 -m pytest tests/test_gpu.py tests/test_graph_buffers.py tests/test_persistent_decode.py -q -p no:cacheprovider 2>&1 | grep -v -i warn | tail -3 | tee $out/gpu_tests.txt
timeout 60 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "gumbel or decode or bitmask" 2>&1 | grep -v -i warn | tail -2 | tee -a $out/gpu_tests.txt
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 128 --num-iters 3)
run lat_new "${lat[@]}" --input-len 512 32768 2>&1 | grep -i "tpot\|exit\|rror" | head -4
old=$PWD/.devrun/old
(cd $old && run lat512_old "${lat[@]}" --input-len 512 2>&1 | grep -i "tpot\|exit\|rror" | head -3)
run lat512_new "${lat[@]}" --input-len 512 2>&1 | grep -i "tpot\|exit\|rror" | head -3
