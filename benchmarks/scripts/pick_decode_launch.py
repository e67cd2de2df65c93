"""The decode launch a sweep (sweep_decode_kv_dtype.py) found fastest over given cases, as RAYGRID_DECODE_CONFIG JSON
for an A/B run of the engine:

    python benchmarks/scripts/pick_decode_launch.py SWEEP.json bfloat16 16x8x256x530,16x8x192x862
    # -> {"block_n": 64, "num_warps": 2, "num_stages": 2}   (fp8: fp8_block_n)

A launch counts only if it ran every case and its output stayed within 0.05 of the default launch's. The decode
launch has one num_warps and num_stages for both cache dtypes, so an fp8 pick sets them for bf16 caches too."""

from __future__ import annotations

import collections
import json
import sys


def main() -> None:
    sweep, kv_dtype, cases = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    rows = json.load(open(sweep))["rows"]
    wanted = {tuple(int(x) for x in c.split("x")) for c in cases}
    total, seen = collections.Counter(), collections.Counter()
    for r in rows:
        case = (r["heads"], r["kv_heads"], r["seqs"], r["context"])
        if r["kv_dtype"] != kv_dtype or case not in wanted or "us" not in r or r["max_abs_diff"] > 0.05:
            continue
        launch = (r["block_n"], r["warps"], r["stages"])
        total[launch] += r["us"]
        seen[launch] += 1
    block_n, warps, stages = min((launch for launch in total if seen[launch] == len(wanted)), key=total.__getitem__)
    prefix = "fp8_" if kv_dtype == "fp8" else ""
    print(json.dumps({prefix + "block_n": block_n, "num_warps": warps, "num_stages": stages}))


if __name__ == "__main__":
    main()
