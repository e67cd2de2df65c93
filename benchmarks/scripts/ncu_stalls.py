"""Where a kernel's warps wait, from Nsight Compute's per-instruction export (``ncu --import R.ncu-rep --page source
--print-source sass --csv -k regex:NAME > sass.csv``): warp stall samples by opcode and by reason, and the
instructions with the most samples with their two main reasons. Runs anywhere (no GPU, no ncu).

    python benchmarks/scripts/ncu_stalls.py sass.csv [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import csv
import re

SAMPLES = "Warp Stall Sampling (All Samples)"


def read(path: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(open(path)))
    start = next(i for i, row in enumerate(rows) if row and row[0] == "Address")
    header = rows[start]
    return header, [row for row in rows[start + 1:] if len(row) == len(header)]


def number(text: str) -> float:
    return float(text.replace(",", "") or 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    header, rows = read(args.csv)
    samples, source, executed = header.index(SAMPLES), header.index("Source"), header.index("Instructions Executed")
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    total = sum(number(row[samples]) for row in rows) or 1.0
    by_opcode, runs = collections.Counter(), collections.Counter()
    by_reason = collections.Counter()
    for row in rows:
        opcode = re.sub(r"^@!?U?P\w+\s+", "", row[source].strip()).split(" ")[0]
        by_opcode[opcode] += number(row[samples])
        runs[opcode] += number(row[executed])
        for name in reasons:
            by_reason[name] += number(row[header.index(name)])
    print(f"{len(rows)} instructions, {total:.0f} warp samples")
    reason_total = sum(by_reason.values()) or 1.0
    print("by reason:", ", ".join(f"{name[6:]} {100 * v / reason_total:.1f}%" for name, v in by_reason.most_common(10)))
    print("by opcode:")
    for opcode, value in by_opcode.most_common(18):
        print(f"  {opcode:32s} {100 * value / total:5.1f}% of samples, executed {runs[opcode]:.3g} times")
    print("instructions:")
    for row in sorted(rows, key=lambda r: -number(r[samples]))[:args.top]:
        main_reasons = sorted(((number(row[header.index(n)]), n[6:]) for n in reasons), reverse=True)[:2]
        print(f"  {row[0][-6:]} {row[source].strip()[:64]:64s} {100 * number(row[samples]) / total:5.1f}%  "
              + ", ".join(f"{n} {v:.0f}" for v, n in main_reasons))


if __name__ == "__main__":
    main()
