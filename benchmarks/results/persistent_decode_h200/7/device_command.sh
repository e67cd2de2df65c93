# session 9 command 7: the kernel tests (with the residency guard), then launches of the persistent pass at 512, 8k, 32k
out=$1
timeout 120 python3 -m pytest tests/test_persistent_decode.py -q -p no:cacheprovider 2>&1 | grep -v -i warn | tail -4 | tee $out/kernel_tests.txt
timeout 330 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_7.json --contexts 512 8192 32768 --replays 30 \
  --variant '{"num_stages": 3}' --variant '{"num_programs": 264, "num_warps": 4, "block_n": 64}' \
  --variant '{"num_programs": 264, "num_warps": 4, "block_n": 64, "rows_per_unit": 16}' \
  --variant '{"num_programs": 264, "num_warps": 4, "block_n": 64, "num_stages": 3}' 2>&1 | grep -v -i warn | python3 -c "
import sys, ast
for line in sys.stdin:
    head, sep, rest = line.partition(': {')
    try:
        d = ast.literal_eval('{' + rest.strip())
        print(head, d.get('variant'), round(d.get('us', 0), 1), 'x%.2f' % d.get('speedup', 0), {k: round(v, 1) for k, v in d.get('stage_us_one_pass', {}).items()}, d.get('same_argmax'), d.get('same_bits_twice'), d.get('error', '')[:200])
    except Exception:
        print(line.strip()[:300])
"
