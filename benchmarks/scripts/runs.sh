# Sourced by the run scripts (multi_gpu.sh, moe.sh): `out` must be set. `rg ARGS` is the raygrid CLI (the GPU
# machine has no console script on PATH); `run NAME ARGS` runs it into OUT/NAME.json and OUT/NAME.log.
# `python3 -c` puts the working directory first on its path, so `rg` imports the raygrid/ of the directory it runs
# in, whatever PYTHONPATH says: run another tree's engine from that tree's directory (as ab_w1.sh does).
rg() { python3 -c 'import sys; from raygrid.entrypoints.cli import main; sys.argv = ["raygrid"] + sys.argv[1:]; sys.exit(main())' "$@"; }
run() { name=$1; shift; echo "== $name: raygrid $*"; rg "$@" --output-json "$out/$name.json" > "$out/$name.log" 2>&1; echo "exit $?"; tail -4 "$out/$name.log"; }
w1=(--dtype bfloat16 --random-range 100 1024 --no-progress)
# With device_prelude.sh's `left` (a device command's): `lat32k NAME "ARGS" LIMIT`, a lone request at 32k
# (`bench latency`) into OUT/NAME within LIMIT s of the command's start; `w1run NAME LIMIT`, W1 the same way.
lat32k() { timeout $(left $3) bash -c "$(declare -f rg run); out=$out; run $1 bench latency $2 --model random-qwen3-0.6b --dtype bfloat16 --input-len 32768" | grep -E "^input|exit"; }
w1run() { timeout $(left $2) bash -c "$(declare -f rg run); out=$out; run $1 bench throughput --model random-qwen3-0.6b --num-prompts 256 ${w1[*]}" | grep -E "tok/s|exit" | head -3; }
# `rewrite FILE OLD NEW`: an A/B script's change of the tree in place for its B side (OLD must occur exactly once).
rewrite() { python3 -c 'import sys; p, old, new = sys.argv[1:]; s = open(p).read(); assert s.count(old) == 1, (p, old); open(p, "w").write(s.replace(old, new))' "$@"; }
