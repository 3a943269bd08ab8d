#!/usr/bin/env python3
"""Draws bench/instructions.sh's figures of two or more builds side by side.

  bench/instructions_chart.py OUT.png LABEL=FILE.json [LABEL=FILE.json ...]

Each FILE is what `OUT=FILE bench/instructions.sh` wrote (user instructions per request, by
workload); the bars are grouped by workload, one per build, in the order given."""
import json
import sys
import textwrap

NAMES = {"spindle": "HTTP/1.1 hello", "ceiling": "C ceiling (HTTP/1.1)",
         "spindle-c10": "HTTP/1.1 hello, c10",
         "spindle-h2c": "h2c hello (c10 m10)", "proxy-h1": "proxy h1 -> h1",
         "proxy-h2tls": "proxy h2 TLS -> h1", "proxy-h2up-h2tls": "proxy h2 TLS -> h2 TLS"}


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        sys.exit(__doc__)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [(a.split("=", 1)[0], json.load(open(a.split("=", 1)[1]))) for a in sys.argv[2:]]
    workloads = [w for w in runs[0][1] if not w.startswith("ceiling")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(runs)
    for i, (label, figures) in enumerate(runs):
        xs = [x + (i - (len(runs) - 1) / 2) * width for x in range(len(workloads))]
        bars = ax.bar(xs, [figures.get(w, 0) for w in workloads], width, label=label)
        ax.bar_label(bars, fmt="%d", fontsize=7)
    ax.set_xticks(range(len(workloads)),
                  [textwrap.fill(NAMES.get(w, w), 16) for w in workloads], fontsize=8)
    ax.set_ylabel("user instructions per request (callgrind)")
    ax.set_title("spindle, one worker: instructions per request")
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
