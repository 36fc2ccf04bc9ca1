"""moekit next to its peers: one table from `moekit bench --json` and bench/peers/moe_peers.py --json.

    python3 bench/report.py --moekit moekit.json [more.json ...] --peers peers-deepseek-v3.json [more.json ...] [--markdown OUT.md]

Per (preset, T): moekit µs, each peer's µs, the speedup of moekit over the fastest peer that
ran, moekit's roofline efficiency (floor / time, DESIGN §9) and each peer's error against
moekit's output. Then per preset the geometric mean of efficiency over T and issue #5's
targets as met/missed lines: moekit faster than every peer at every T >= 8; geo-mean
efficiency >= 60%; at T = 1 and T = 8, GB/s >= 70% of the measured copy bandwidth.
"""
import argparse
import json
import math
import sys
from dataclasses import dataclass, field

EFFICIENCY_TARGET = 0.60
BANDWIDTH_TARGET = 0.70
BANDWIDTH_TOKENS = (1, 8)
SPEEDUP_MIN_TOKENS = 8


@dataclass
class Row:
    """One (preset, T): moekit's case and every peer's case for it."""
    preset: str
    quant: str
    tokens: int
    moekit: dict
    peers: dict = field(default_factory=dict)  # peer name -> case

    def efficiency(self):
        """floor / time: the JSON's value, else from floor_us."""
        if self.moekit.get("efficiency") is not None:
            return float(self.moekit["efficiency"])
        floor, us = self.moekit.get("floor_us"), self.moekit.get("us")
        return floor / us if floor and us else None

    def gbs(self):
        if self.moekit.get("gbs") is not None:
            return float(self.moekit["gbs"])
        nbytes, us = self.moekit.get("bytes"), self.moekit.get("us")
        return nbytes / us / 1e3 if nbytes and us else None

    def ok_peers(self):
        """{peer: µs} of the peers that ran."""
        return {name: c["us"] for name, c in self.peers.items() if c.get("status") == "ok" and c.get("us")}

    def speedup(self):
        """moekit over the fastest peer that ran, and that peer's name."""
        ok = self.ok_peers()
        if not ok or not self.moekit.get("us"):
            return None, None
        fastest = min(ok, key=ok.get)
        return ok[fastest] / self.moekit["us"], fastest


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_moekit(paths):
    """One record from one or more `moekit bench --json` files (e.g. one per preset): the first
    file's machine and ceilings, every file's cases in order."""
    records = [read_json(path) for path in paths]
    merged = dict(records[0])
    merged["cases"] = [case for record in records for case in record.get("cases", [])]
    return merged


def copy_gbs(moekit):
    """The copy ceiling, from `ceilings` (or the older top-level key)."""
    ceilings = moekit.get("ceilings") or {}
    return ceilings.get("copy_gbs") or moekit.get("copy_gbs")


def load_rows(moekit, peer_files):
    """Rows in moekit's order; peers attached by (preset, T)."""
    rows = [Row(c.get("preset", "?"), c.get("quant", "?"), int(c["tokens"]), c) for c in moekit.get("cases", [])]
    by_key = {(r.preset, r.tokens): r for r in rows}
    for peers in peer_files:
        preset = peers.get("preset", "")
        for case in peers.get("cases", []):
            row = by_key.get((preset, int(case["tokens"])))
            if row is None:
                print(f"report: peer case {preset} T={case['tokens']} ({case.get('peer')}) has no moekit case",
                      file=sys.stderr)
                continue
            row.peers[case["peer"]] = case
    return rows


def peer_names(rows):
    names = []
    for r in rows:
        names += [n for n in r.peers if n not in names]
    return names


# ---- table ----------------------------------------------------------------------------

def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def peer_cell(case, key):
    if case is None:
        return "-"
    if case.get("status") != "ok":
        return "n/a"
    if key == "us":
        return fmt(case.get("us"), ".1f")
    return "NaN" if case.get("nan") else fmt(case.get("rel_err_vs_moekit"), ".1e")


def table(rows):
    names = peer_names(rows)
    header = (["preset", "quant", "T", "moekit us"] + [f"{n} us" for n in names] +
              ["speedup", "eff %"] + [f"{n} err" for n in names])
    body = []
    for r in rows:
        speedup, fastest = r.speedup()
        eff = r.efficiency()
        body.append([r.preset, r.quant, str(r.tokens), fmt(r.moekit.get("us"), ".1f")] +
                    [peer_cell(r.peers.get(n), "us") for n in names] +
                    [f"{speedup:.2f}x ({fastest})" if speedup else "-", fmt(eff and 100 * eff, ".1f")] +
                    [peer_cell(r.peers.get(n), "err") for n in names])
    return header, body


def render_text(header, body):
    """Aligned columns: the two name columns left, the numbers right."""
    widths = [max(len(x) for x in col) for col in zip(header, *body)]

    def line(cells):
        return "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(b) for b in body])


def render_markdown(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])


# ---- targets --------------------------------------------------------------------------

def geo_mean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def target_speed(rows):
    checked = [r for r in rows if r.tokens >= SPEEDUP_MIN_TOKENS and r.ok_peers()]
    if not checked:
        return "no data", "no peer ran at T >= 8"
    misses = [f"T={r.tokens}: {name} {us:.1f} us vs {r.moekit['us']:.1f} us"
              for r in checked for name, us in r.ok_peers().items() if us <= r.moekit["us"]]
    return ("missed", "; ".join(misses)) if misses else ("met", f"{len(checked)} T values")


def target_efficiency(rows):
    mean = geo_mean([r.efficiency() for r in rows])
    if mean is None:
        return "no data", "no efficiency in moekit's JSON"
    return ("met" if mean >= EFFICIENCY_TARGET else "missed"), f"geo-mean {100 * mean:.1f}%"


def target_bandwidth(rows, copy):
    small = [r for r in rows if r.tokens in BANDWIDTH_TOKENS and r.gbs()]
    if not small or not copy:
        return "no data", "needs T=1/T=8 cases with GB/s and the copy ceiling"
    parts = [f"T={r.tokens}: {r.gbs():.0f} GB/s = {100 * r.gbs() / copy:.0f}%" for r in small]
    ok = all(r.gbs() >= BANDWIDTH_TARGET * copy for r in small)
    return ("met" if ok else "missed"), ", ".join(parts) + f" of {copy:.0f}"


def summary(rows, copy):
    lines = []
    for preset in dict.fromkeys(r.preset for r in rows):
        mine = [r for r in rows if r.preset == preset]
        mean = geo_mean([r.efficiency() for r in mine])
        lines.append(f"{preset}: geo-mean efficiency {fmt(mean and 100 * mean, '.1f')}% over T = "
                     f"{','.join(str(r.tokens) for r in mine)}")
        for label, (state, detail) in (("faster than every peer at T >= 8", target_speed(mine)),
                                       ("geo-mean efficiency >= 60%", target_efficiency(mine)),
                                       ("T=1,8 GB/s >= 70% of copy", target_bandwidth(mine, copy))):
            lines.append(f"  {state:7s} {label}  ({detail})")
    return "\n".join(lines)


def heading(moekit):
    return (f"moekit {moekit.get('moekit_version', '?')} ({moekit.get('git_commit', '?')}) on "
            f"{moekit.get('gpu', '?')}, driver {moekit.get('driver', '?')}, routing {moekit.get('routing', '?')}, "
            f"copy {fmt(copy_gbs(moekit), '.0f')} GB/s")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--moekit", nargs="+", required=True, help="moekit bench --json output(s)")
    p.add_argument("--peers", nargs="*", default=[], help="moe_peers.py --json outputs")
    p.add_argument("--markdown", help="also write the table and targets as Markdown here")
    args = p.parse_args(argv)
    moekit = read_moekit(args.moekit)
    rows = load_rows(moekit, [read_json(path) for path in args.peers])
    header, body = table(rows)
    targets = summary(rows, copy_gbs(moekit))
    print(heading(moekit))
    print(render_text(header, body))
    print()
    print(targets)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"{heading(moekit)}\n\n{render_markdown(header, body)}\n\n```\n{targets}\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
