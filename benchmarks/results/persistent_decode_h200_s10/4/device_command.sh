# session 10 command 4: GPU tests of the final tree (64-bit offsets where a cache half needs them, the pass); the pass
# with 128-key tiles at two programs an SM (each program then has twice the keys and values in flight)
out=$1
timeout 200 python3 -m pytest tests/test_kernels.py tests/test_persistent_decode.py tests/test_gpu.py -q -p no:cacheprovider -k "past_2_31 or decode or prefill or persistent or launch_only" 2>&1 | grep -v -i warn | tail -3 | tee $out/gpu_tests.txt
timeout 240 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_4.json --contexts 512 8192 32832 40900 --replays 30 \
  --variant '{"block_n": 128}' --variant '{"block_n": 128, "splits": 33}' 2>&1 | grep -v -i warn | python3 -c "
import sys, ast
for line in sys.stdin:
    head, sep, rest = line.partition(': {')
    try:
        d = ast.literal_eval('{' + rest.strip())
        print(head.split(',')[0].replace(' us', ''), d.get('variant'), round(d.get('us', 0), 1), 'x%.2f' % d.get('speedup', 0), [round(v, 1) for v in d.get('stage_us_one_pass', {}).values()], d.get('programs'), d.get('splits'), d.get('same_argmax'), d.get('same_bits_twice'), d.get('error', '')[:300])
    except Exception:
        print(line.strip()[:300])
"
# the engine end to end at 32k, with the pass taking 128-key tiles and contexts up to 40,960 (a rewrite of this copy only)
. benchmarks/scripts/runs.sh
rewrite raygrid/kernels/persistent_decode.py "MAX_CONTEXT = 32768" "MAX_CONTEXT = 40960"
rewrite raygrid/kernels/persistent_decode.py "block_n: int = 64," "block_n: int = 128,"
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 32768 --output-len 64 --num-iters 2)
run lat32k_on_1 "${lat[@]}" --persistent-decode 2>&1 | grep -i "tpot\|exit\|rror" | head -4
run lat32k_off_1 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -4
run lat32k_on_2 "${lat[@]}" --persistent-decode 2>&1 | grep -i "tpot\|exit\|rror" | head -4
