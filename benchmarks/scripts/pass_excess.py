"""What a one-launch decode pass's time above its memory floor is made of, from ``persistent_decode_pass.py``'s JSON
records: the part present at the shortest context (the layers' stages, barriers and products, whatever the context)
and the part that grows with the context (attention reading the cache below the floor's rate).

For each record and each launch (variant) timed at two or more contexts it prints, at every context, the pass, its
floor and the excess (pass minus floor), then:
- ``fixed``: the excess at the shortest context;
- ``grows``: the excess at the longest context minus ``fixed``;
- ``incremental read``: the floor's extra bytes between the shortest and longest context (the cache's, at the
  record's copy rate) over the pass's extra time, in TB/s, against that copy rate.

    python benchmarks/scripts/pass_excess.py PASS.json [PASS.json ...] [--launch JSON] [--json OUT.json]

``--launch '{}'`` keeps the default launch only (any variant's JSON, as the record names it, keeps that one).

No GPU needed: it reads the records only.
"""

from __future__ import annotations

import argparse
import json


def excess(record: dict) -> list[dict]:
    """Each launch's excess by context and its split into ``fixed`` and ``grows`` (the module's docstring)."""
    bandwidth = record["copy_bandwidth_bytes_per_s"]
    by_variant: dict[str, list[tuple[int, float, float, dict]]] = {}
    for row in record["rows"]:
        for v in row["variants"]:
            by_variant.setdefault(json.dumps(v["variant"], sort_keys=True), []).append(
                (row["context"], v["us"], row["floor_us"], v.get("stage_us_one_pass", {})))
    out = []
    for name, points in by_variant.items():
        points.sort()
        short, long_ = points[0], points[-1]
        entry = dict(variant=json.loads(name), machine=record["machine"], commit=record["git_commit"],
                     copy_tb_per_s=bandwidth / 1e12,
                     contexts=[dict(context=c, us=us, floor_us=floor, excess_us=us - floor,
                                    attention_us=stages.get("attention")) for c, us, floor, stages in points])
        if long_[0] > short[0]:
            extra_bytes = (long_[2] - short[2]) * 1e-6 * bandwidth
            entry.update(fixed_us=short[1] - short[2], grows_us=(long_[1] - long_[2]) - (short[1] - short[2]),
                         incremental_tb_per_s=extra_bytes / ((long_[1] - short[1]) * 1e-6) / 1e12)
        out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", help="persistent_decode_pass.py JSON records")
    parser.add_argument("--launch", help="only this launch (its variant's JSON; '{}' is the default)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    everything = []
    for path in args.records:
        with open(path) as f:
            record = json.load(f)
        for entry in excess(record):
            if args.launch is not None and entry["variant"] != json.loads(args.launch):
                continue
            everything.append(dict(record=path, **entry))
            print(f"{path}: {entry['machine']}, {entry['commit']}, launch {json.dumps(entry['variant'])}")
            for c in entry["contexts"]:
                attention = f", attention {c['attention_us']:.2f} us a layer" if c["attention_us"] is not None else ""
                print(f"  {c['context']:>6} tokens: pass {c['us']:8.1f} us, floor {c['floor_us']:7.1f}, "
                      f"excess {c['excess_us']:6.1f}{attention}")
            if "fixed_us" in entry:
                print(f"  fixed {entry['fixed_us']:.1f} us, grows {entry['grows_us']:.1f} us; incremental read "
                      f"{entry['incremental_tb_per_s']:.2f} TB/s against a copy's {entry['copy_tb_per_s']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
