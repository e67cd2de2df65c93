#!/usr/bin/env bash
# Thirty-eighth session, on any card: the one-launch pass's barriers program by program (--timeline 5) at 512 and
# 32,768 tokens, the default and the variants given from $2 on (JSON each), with the SM each program ran on and, for
# the programs most often last to arrive, the other programs on their SMs. Carry [".devlite"]; results under $OUT/r.
# $1: the commit, $2...: the variants.
. benchmarks/scripts/device_prelude.sh "$1"
V=(); for v in "${@:2}"; do V+=(--variant "$v"); done
timeout $(left 400) python3 benchmarks/scripts/persistent_decode_pass.py $R/timeline.json --contexts 512 32768 --timeline 5 \
  "${V[@]}" > $R/timeline.txt 2>&1; echo "timeline exit $?"
python3 - $R/timeline.json <<'PY' | tee $R/timeline_summary.txt
import json, sys
d = json.load(open(sys.argv[1]))
for row in d["rows"]:
    for v in row["variants"]:
        print(row["context"], json.dumps(v["variant"]), "us", round(v.get("us", 0), 1), v.get("error", ""))
        t = v.get("barrier_timeline")
        if not t:
            continue
        sms = t["sm_of_program"]
        print("    programs an SM:", t["programs_an_sm"])
        for stage in ("qkv", "attention", "o_proj", "gate_up", "down"):
            f = t[stage]
            mates = [[p, c, sm, [q for q, s in enumerate(sms) if s == sm and q != p]] for p, c, sm in f["last_programs"]]
            print("   ", f"{stage:9}", " ".join(f"{k} {f[k]:.2f}" for k in ("stage", "work", "work_max", "last_arrival",
                  "barrier", "pass_spread")), "last (program, times, SM, its mates):", mates)
PY
tar -czf $OUT/results.tgz -C $OUT r
