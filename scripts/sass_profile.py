#!/usr/bin/env python3
"""Summarizes a per-SASS-line Nsight Compute export (the CSV the profile step of
scripts/device-test.sh writes: `ncu -i REP --page source --csv --print-source sass`).

  scripts/sass_profile.py FILE.csv [--per N] [--lines]

Prints executed warp instructions and warp-stall samples per opcode; with --per N the counts
are divided by N (tokens, rows: whatever one unit of work is) and the listing is split into
blocks of 100 SASS lines with their totals, so the expensive regions of a kernel stand out;
--lines prints every executed line too.
"""
import argparse
import collections
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--per", type=float, default=1.0, help="divide counts by this many units of work")
    ap.add_argument("--lines", action="store_true", help="print every executed SASS line")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    # The export starts with a "Kernel Name" line, then the header.
    start = next((i for i, r in enumerate(rows) if "Instructions Executed" in r), None)
    if start is None:
        sys.exit(f"{args.csv}: no 'Instructions Executed' column (not an ncu source-page export?)")
    header, data = rows[start], rows[start + 1:]
    col_src, col_exec = header.index("Source"), header.index("Instructions Executed")
    col_stall = header.index("Warp Stall Sampling (All Samples)")

    def number(s):
        try:
            return int(s.replace(",", ""))
        except ValueError:
            return 0

    lines = [(i, r[col_src].strip(), number(r[col_exec]), number(r[col_stall])) for i, r in enumerate(data)
             if len(r) > max(col_src, col_exec, col_stall)]
    executed = sum(x for _, _, x, _ in lines)
    stalls = sum(s for _, _, _, s in lines) or 1
    by_op, stall_by_op = collections.Counter(), collections.Counter()
    for _, src, x, s in lines:
        words = src.split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        op = op.split(".")[0]
        by_op[op] += x
        stall_by_op[op] += s
    print(f"executed {executed / args.per:.1f} warp instructions per unit, {stalls} stall samples")
    for op, x in by_op.most_common(25):
        print(f"  {op:10s} {x / args.per:10.1f}  {100 * x / max(executed, 1):5.1f}%   stalls {100 * stall_by_op[op] / stalls:5.1f}%")
    print("blocks of 100 SASS lines: first line, instructions per unit, % of stall samples")
    blocks = collections.OrderedDict()
    for i, src, x, s in lines:
        b = blocks.setdefault(i // 100, [src, 0, 0])
        b[1] += x
        b[2] += s
    for b, (first, x, s) in blocks.items():
        if x:
            print(f"  {b * 100:6d}  {x / args.per:8.1f}  {100 * s / stalls:5.1f}%  {first[:60]}")
    if args.lines:
        for i, src, x, s in lines:
            if x:
                print(f"{i:6d} {x / args.per:8.2f} {s:6d}  {src[:90]}")


if __name__ == "__main__":
    main()
