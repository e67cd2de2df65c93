# Command 5: a lone request's step at 512 tokens, old tree (b33c1aa) against new (the one-launch pass replayed from a
# CUDA graph; decode logits without a gather), layer by layer (off) and one launch (on); then the GPU tests.
out=$1; cd "$(dirname "$0")/.."; root=$PWD
R=$out/r; mkdir -p $R/old $R/new
PYTHONPATH=/tmp/site:$root/.devrun/old timeout 110 python3 benchmarks/scripts/step_timeline.py $R/old --context 512 --settings off,on > $R/old/stdout.txt 2>&1; echo "old exit $?"
timeout 110 python3 benchmarks/scripts/step_timeline.py $R/new --context 512 --settings off,on > $R/new/stdout.txt 2>&1; echo "new exit $?"
for t in old new; do grep -E "^(on|off) " $R/$t/stdout.txt | python3 -c "
import sys, json
for line in sys.stdin:
    s, c, j = line.split(' ', 2); d = json.loads(j)
    print('$t', s, 'tpot %.3f launch_host %.3f gpu_step %.3f prepare %.3f sample %.3f update_states %.4f' % (d['tpot_ms'], d['launch_host_ms'], d['gpu_step_ms'], d['phases_ms']['prepare'], d['phases_ms']['sample'], d['phases_ms']['update_states']))"; done
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_persistent_decode.py > $R/test_gpu.txt 2>&1; echo "tests exit $?"; tail -3 $R/test_gpu.txt
cp .devrun/c5.sh $R/device_command.sh
tar -C $out -czf $out/c5.tgz r && rm -rf $R
