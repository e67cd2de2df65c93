#!/usr/bin/env bash
# Nineteenth session, command 6: more tiles read during the barriers (gate's; down_proj's over slices of 1,024), the
# pass against the engine's, and the pass's kernel tests with every flag.
out=$1; cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass.json --contexts 512 32832 --variant '{"preload": 7}' --variant '{"preload": 11, "down_slice": 1024}' --variant '{"preload": 15, "down_slice": 1024}' > $out/pass.txt 2>&1; echo "pass exit $?"
python3 - $out/pass.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    for v in r["variants"]:
        print(r["context"], v["variant"], round(v.get("us", 0), 1), {k: round(x, 2) for k, x in v.get("stage_us_one_pass", {}).items()}, v.get("same_argmax"), v.get("error", "")[:200])
PY
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/test_persistent_decode.py > $out/tests_kernel.txt 2>&1; echo "kernel tests exit $?"; tail -2 $out/tests_kernel.txt
cp .devrun/s19_g.sh $out/device_command.sh
