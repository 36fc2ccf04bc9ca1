"""moekit against its peers as a picture: one row per preset, roofline efficiency on the left,
speedup over each peer on the right, both against T.

    python3 bench/plot.py --moekit moekit.json --peers peers-*.json --out docs/bench.png

Reads the same JSON as bench/report.py (`moekit bench --json`, bench/peers/moe_peers.py --json).
"""
import argparse
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)

from report import EFFICIENCY_TARGET, load_rows, peer_names, read_json, read_moekit  # noqa: E402


def plot_efficiency(ax, rows):
    points = [(r.tokens, 100 * r.efficiency()) for r in rows if r.efficiency() is not None]
    if points:
        ax.plot(*zip(*points), marker="o", color="tab:blue", label="moekit")
    ax.axhline(100 * EFFICIENCY_TARGET, color="tab:red", linestyle="--", linewidth=1, label="target 60%")
    ax.set_ylim(0, 105)
    ax.set_ylabel("roofline efficiency (%)")


def plot_speedup(ax, rows, names):
    for name in names:
        points = [(r.tokens, r.peers[name]["us"] / r.moekit["us"]) for r in rows
                  if name in r.peers and r.peers[name].get("status") == "ok" and r.peers[name].get("us")
                  and r.moekit.get("us")]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_yscale("log")
    ax.set_ylabel("speedup of moekit (peer µs / moekit µs)")


def style_axis(ax, title, tokens, legend_outside=False):
    ax.set_xscale("log", base=2)
    ax.set_xticks(tokens)
    ax.set_xticklabels([str(t) for t in tokens])
    ax.set_xlabel("tokens T")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if legend_outside:  # many peer lines: keep the legend off the data
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8)


def figure(moekit, rows):
    presets = list(dict.fromkeys(r.preset for r in rows))
    names = peer_names(rows)
    fig, axes = plt.subplots(len(presets), 2, figsize=(13.5, 3.6 * len(presets)), squeeze=False)
    for (left, right), preset in zip(axes, presets):
        mine = sorted((r for r in rows if r.preset == preset), key=lambda r: r.tokens)
        tokens = [r.tokens for r in mine]
        label = f"{preset} ({mine[0].quant})"
        plot_efficiency(left, mine)
        style_axis(left, f"{label}: roofline efficiency", tokens)
        plot_speedup(right, mine, names)
        style_axis(right, f"{label}: speedup over peers", tokens, legend_outside=True)
    fig.suptitle(f"moekit {moekit.get('moekit_version', '?')} ({moekit.get('git_commit', '?')}) on "
                 f"{moekit.get('gpu', '?')}", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--moekit", nargs="+", required=True, help="moekit bench --json output(s)")
    p.add_argument("--peers", nargs="*", default=[], help="moe_peers.py --json outputs")
    p.add_argument("--out", default="docs/bench.png")
    args = p.parse_args(argv)
    moekit = read_moekit(args.moekit)
    rows = load_rows(moekit, [read_json(path) for path in args.peers])
    if not rows:
        print("plot: moekit's JSON has no cases", file=sys.stderr)
        return 1
    figure(moekit, rows).savefig(args.out, dpi=120)
    print(f"plot: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
