# session 10 command 2: the 2**31 test without and with the 64-bit fix; GPU tests; the pass with L2 read-ahead variants
out=$1
. benchmarks/scripts/runs.sh
cp raygrid/kernels/triton_attention.py /tmp/ta_fixed.py
rewrite raygrid/kernels/triton_attention.py "other=0).to(tl.int64)  # past 2**31 elements" "other=0)"
rewrite raygrid/kernels/triton_attention.py "block.to(tl.int64) * stride_cb" "block * stride_cb"
grep -c "int64" raygrid/kernels/triton_attention.py
timeout 100 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "past_2_31" 2>&1 | grep -v -i warn | grep -i "passed\|failed\|error" | tail -4 | sed 's/^/32-bit: /' | tee $out/test_2_31_without_fix.txt
cp /tmp/ta_fixed.py raygrid/kernels/triton_attention.py
timeout 200 python3 -m pytest tests/test_persistent_decode.py tests/test_kernels.py tests/test_gpu.py -q -p no:cacheprovider -k "persistent or launch_only or decode or prefill or past_2_31" 2>&1 | grep -v -i warn | tail -4 | tee $out/gpu_tests.txt
timeout 300 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_2.json --contexts 512 8192 32832 40900 --replays 30 \
  --variant '{"prefetch": true}' --variant '{"kv_ahead": 2}' --variant '{"kv_ahead": 4}' --variant '{"kv_ahead": 8}' \
  --variant '{"prefetch": true, "kv_ahead": 4}' 2>&1 | grep -v -i warn | python3 -c "
import sys, ast
for line in sys.stdin:
    head, sep, rest = line.partition(': {')
    try:
        d = ast.literal_eval('{' + rest.strip())
        print(head.split(',')[0].replace(' us', ''), d.get('variant'), round(d.get('us', 0), 1), 'x%.2f' % d.get('speedup', 0), [round(v, 1) for v in d.get('stage_us_one_pass', {}).values()], d.get('same_argmax'), d.get('same_bits_twice'), d.get('error', '')[:300])
    except Exception:
        print(line.strip()[:300])
"
