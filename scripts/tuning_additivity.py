#!/usr/bin/env python3
"""How far a tuning cache's staged times stray from an additive model, per entry.

A staged tactic runs GEMM1 and then GEMM2 as separate kernels, so its layer time should be close to
glue + t1(gemm1) + t2(gemm2). Fitting that model (least squares over the entry's winner and
runners-up) leaves residuals that are mostly measurement noise: the tuner's choice between tactics
closer than that is a coin toss. docs/TUNE.md quotes the shipped cache's figures.

    python3 scripts/tuning_additivity.py data/tuning/h200.json [more caches...]
"""
import json
import sys


def staged_times(entry):
    """{(gemm1, gemm2): us} of the entry's staged tactics."""
    table = {}
    for t in [entry["winner"]] + entry.get("runners_up", []):
        words = dict(w.split("=", 1) for w in t["tactic"].split()[1:] if "=" in w)
        if t["tactic"].startswith("staged") and "gemm1" in words and "gemm2" in words:
            table[(words["gemm1"], words["gemm2"])] = t["us"]
    return table


def residuals(table):
    """Relative residuals (%) of us = a[gemm1] + b[gemm2], fitted by alternating means."""
    g1 = sorted({k[0] for k in table})
    g2 = sorted({k[1] for k in table})
    a = {g: 0.0 for g in g1}
    b = {g: 0.0 for g in g2}
    for _ in range(300):
        for g in g1:
            v = [table[(g, h)] - b[h] for h in g2 if (g, h) in table]
            a[g] = sum(v) / len(v)
        for h in g2:
            v = [table[(g, h)] - a[g] for g in g1 if (g, h) in table]
            b[h] = sum(v) / len(v)
    return {k: 100.0 * (us - a[k[0]] - b[k[1]]) / us for k, us in table.items()}


def main(paths):
    print(f"{'cache':24} {'E':>4} {'H':>5} {'T':>6} {'tactics':>7} {'rms %':>6} {'max %':>6}  {'winner %':>8}  timed")
    for path in paths:
        for e in json.load(open(path))["entries"]:
            table = staged_times(e)
            if len({k[0] for k in table}) < 2 or len({k[1] for k in table}) < 2:
                continue  # one GEMM1 or one GEMM2: nothing to compare
            r = residuals(table)
            rms = (sum(x * x for x in r.values()) / len(r)) ** 0.5
            words = dict(w.split("=", 1) for w in e["winner"]["tactic"].split()[1:] if "=" in w)
            mine = r.get((words.get("gemm1"), words.get("gemm2")))
            p = e["problem"]
            # moekit tune says how it timed in each entry's "measured"
            timed = "side by side" if "interleaved" in e.get("measured", "") else "one after another"
            winner = "-" if mine is None else f"{mine:+.1f}"
            print(f"{path[-24:]:24} {p['experts']:>4} {p['hidden']:>5} {e['tokens']:>6} {len(table):>7} "
                  f"{rms:>6.1f} {max(abs(x) for x in r.values()):>6.1f}  {winner:>8}  {timed}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
