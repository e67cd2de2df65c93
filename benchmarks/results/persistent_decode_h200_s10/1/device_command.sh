# session 10 command 1: GPU tests of the untested changes (attend_range refactor, the pass), then launch variants at 512 / 32,832 / 65,536
out=$1
timeout 200 python3 -m pytest tests/test_persistent_decode.py tests/test_kernels.py tests/test_gpu.py -q -p no:cacheprovider -k "persistent or launch_only or decode" 2>&1 | grep -v -i warn | tail -6 | tee $out/gpu_tests.txt
timeout 340 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_1.json --contexts 512 32832 65536 --replays 30 \
  --variant '{"splits": 33}' --variant '{"q_in_registers": true}' --variant '{"prefetch": true}' \
  --variant '{"programs_per_sm": 3, "max_registers": 168}' \
  --variant '{"q_in_registers": true, "prefetch": true, "splits": 33}' 2>&1 | grep -v -i warn | python3 -c "
import sys, ast
for line in sys.stdin:
    head, sep, rest = line.partition(': {')
    try:
        d = ast.literal_eval('{' + rest.strip())
        print(head, d.get('variant'), round(d.get('us', 0), 1), 'x%.2f' % d.get('speedup', 0), {k: round(v, 1) for k, v in d.get('stage_us_one_pass', {}).items()}, d.get('programs'), d.get('splits'), d.get('same_argmax'), d.get('same_bits_twice'), d.get('error', '')[:300])
    except Exception:
        print(line.strip()[:300])
"
