# session 11 command 4 (tree = 49af7cf + one-copy staging, graph-prepare guards, one-launch best chunk, attention-loop stages): GPU tests; batch-1 timeline old/new alternating at 512; the pass with the attention loop at 5 and 7 stages
out=$1
timeout 200 python3 -m pytest tests/test_gpu.py tests/test_graph_buffers.py tests/test_persistent_decode.py tests/test_kernels.py -q -p no:cacheprovider -k "not test_kernels or gumbel or decode or bitmask" 2>&1 | grep -v -i warn | tail -4 | tee $out/gpu_tests.txt
old=$PWD/.devrun/old
for i in 1 2; do
  (cd $old && NOTE=_old$i PYTHONPATH=/tmp/site:$old timeout 90 python3 $OLDPWD/.devrun/step_timeline.py $out 512 off,on 2>&1 | grep "^off\|^on\|rror" | sed "s/^/old /" | cut -c1-420)
  NOTE=_new$i timeout 90 python3 .devrun/step_timeline.py $out 512 off,on 2>&1 | grep "^off\|^on\|rror" | sed "s/^/new /" | cut -c1-420
done
timeout 120 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_4.json --contexts 512 32832 --replays 30 \
  --variant '{"attention_stages": 5}' --variant '{"attention_stages": 7}' 2>&1 | grep -v -i warn | python3 -c "
import sys, ast
for line in sys.stdin:
    head, sep, rest = line.partition(': {')
    try:
        d = ast.literal_eval('{' + rest.strip())
        print(head, d.get('variant'), round(d.get('us', 0), 1), 'x%.2f' % d.get('speedup', 0), {k: round(v, 1) for k, v in d.get('stage_us_one_pass', {}).items()}, d.get('programs'), d.get('same_argmax'), d.get('same_bits_twice'), d.get('error', '')[:300])
    except Exception:
        print(line.strip()[:300])
"
