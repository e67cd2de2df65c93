# session 9 command 3: attention launches of the persistent decode pass
out=$1
timeout 500 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_3.json --contexts 512 4096 32768 \
  --variant '{"block_n": 128}' --variant '{"prefetch": false, "block_n": 128}' --variant '{"num_warps": 16}' \
  --variant '{"block_n": 32}' --variant '{"block_n": 128, "num_warps": 16}' 2>&1 | grep -v -i warn | python3 -c "
import sys, ast
for line in sys.stdin:
    if ':' in line and '{' in line:
        head, _, rest = line.partition(': {')
        try:
            d = ast.literal_eval('{' + rest.strip())
            print(head, d.get('variant'), round(d.get('us', 0), 1), 'x%.2f' % d.get('speedup', 0), {k: round(v, 1) for k, v in d.get('stage_us_one_pass', {}).items()}, d.get('same_argmax'), d.get('same_bits_twice'), d.get('error', ''))
        except Exception:
            print(line.strip()[:400])
    else:
        print(line.strip()[:400])
"
