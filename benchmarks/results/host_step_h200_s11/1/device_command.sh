# session 11 command 1: the pass with 5 and 7 stages (two tiles in flight); a batch-1 step's host time at 512; the 2**31 test as committed; the long-context decode sweep with 5 stages
out=$1
timeout 230 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_1.json --contexts 512 8192 32832 40900 --replays 30 \
  --variant '{"num_stages": 5}' --variant '{"num_stages": 7}' 2>&1 | grep -v -i warn | python3 -c "
import sys, ast
for line in sys.stdin:
    head, sep, rest = line.partition(': {')
    try:
        d = ast.literal_eval('{' + rest.strip())
        print(head, d.get('variant'), round(d.get('us', 0), 1), 'x%.2f' % d.get('speedup', 0), {k: round(v, 1) for k, v in d.get('stage_us_one_pass', {}).items()}, d.get('programs'), d.get('same_argmax'), d.get('same_bits_twice'), d.get('error', '')[:300])
    except Exception:
        print(line.strip()[:300])
"
timeout 170 python3 .devrun/host_probe.py $out 512 off,on 2>&1 | grep -v -i warn | grep -v "^INFO\|it/s" | tail -14
timeout 60 python3 -m pytest tests/test_kernels.py -q -p no:cacheprovider -k "2_31" 2>&1 | tail -2 | tee $out/gpu_tests.txt
timeout 110 python3 benchmarks/scripts/sweep_decode_attention.py --long --output-json $out/sweep_long.json 2>&1 | grep -v -i warn | tail -30
