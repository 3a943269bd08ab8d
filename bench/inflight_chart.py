#!/usr/bin/env python3
"""How a gateway's CPU per request grows with the requests it holds in flight: the --out file of
a bench/proxy_compare.py run with several --connections (h2load keeps ten streams open on each
connection, so c100 is 1,000 requests in flight), drawn as one panel per set-up, each gateway's
CPU a request (solid) and its user-space part (dashed) against the requests in flight.

  bench/proxy_compare.py --gateways spindle,haproxy,h2o --setups "h2tls->h1,h2tls->h2" \
      --connections 10,30,100,500 --rounds 3 --seconds 4 --out inflight.json
  bench/inflight_chart.py --results inflight.json --out bench/results/inflight.png

Prints the same figures as a table, with spindle's ratio to each peer at each point.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxy_compare import PEERS  # noqa: E402

STREAMS_PER_CONNECTION = 10  # proxy_compare.py's h2load -m10


def gateways_of(results):
    """The gateways measured, spindle first."""
    return sorted({r["server"] for r in results}, key=lambda g: (g != "spindle", g))


def table(results):
    """The figures as text, a block per set-up and a line per load: each gateway's CPU a
    request (user time) and, for a peer, spindle's ratio to it at that load."""
    by = {(r["server"], r["setup"], r["connections"]): r for r in results}
    lines = []
    for setup in sorted({r["setup"] for r in results}):
        lines.append(f"{setup}: CPU a request in µs (user), spindle's ratio")
        for c in sorted({c for (_, s, c) in by if s == setup}):
            mine = by.get(("spindle", setup, c))
            cells = []
            for g in gateways_of(results):
                r = by.get((g, setup, c))
                if r is None:
                    continue
                cell = f"{g} {r['cpu_us_per_request']:.2f} ({r['user_us_per_request']:.2f})"
                if g in PEERS and mine is not None:
                    cell += f" {mine['cpu_us_per_request'] / r['cpu_us_per_request']:.2f}x"
                cells.append(cell)
            lines.append(f"  {c * STREAMS_PER_CONNECTION:>5} in flight: " + ", ".join(cells))
    return lines


def draw(results, out, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = sorted({r["setup"] for r in results})
    gateways = gateways_of(results)
    colours = {g: f"C{i}" for i, g in enumerate(gateways)}  # a gateway's colour in every panel
    fig, axes = plt.subplots(1, len(setups), figsize=(6 * len(setups), 4.5), squeeze=False)
    for ax, setup in zip(axes[0], setups):
        for g in gateways:
            points = sorted((r["connections"], r) for r in results
                            if r["server"] == g and r["setup"] == setup)
            if not points:
                continue
            x = [c * STREAMS_PER_CONNECTION for c, _ in points]
            ax.plot(x, [r["cpu_us_per_request"] for _, r in points], marker="o", label=g,
                    color=colours[g])
            ax.plot(x, [r["user_us_per_request"] for _, r in points], marker=".",
                    linestyle="--", color=colours[g])
        ax.set_xscale("log")
        ax.set_xlabel("requests in flight (h2load -c N -m10)")
        ax.set_ylabel("µs of gateway CPU a request (dashed: user)")
        ax.set_title(setup)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--results", required=True, help="a bench/proxy_compare.py --out file")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="CPU a proxied request against the requests in flight")
    a = p.parse_args()
    with open(a.results) as f:
        # (A gateway that cannot proxy to a set-up's upstream has no figures there.)
        results = [r for r in json.load(f)["results"] if r and r.get("cpu_us_per_request")]
    if not results:
        sys.exit(f"{a.results}: no measured results")
    print("\n".join(table(results)))
    draw(results, a.out, a.title)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
