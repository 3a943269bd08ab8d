#!/usr/bin/env python3
"""Issue 24's goals in one chart: for each comparison, spindle's CPU per request over the peer's,
round by round (each round measures both in turn), with the goal beside it.

Reads the --out files of bench/tls_compare.py, bench/proxy_compare.py and bench/http_compare.py
(any of them; run with --rounds 5 or more for an interval):

  bench/goals_chart.py --tls tls.json --proxy proxy.json --http http.json --out goals.png
      [--markdown docs/benchmarks.md --command "bench/goals.sh 30"]

A dot is the median of the rounds' paired ratios; its bar the interval that holds their true
median nine times in ten (http_compare.median_interval), or the rounds' range with fewer than
five rounds (drawn thin); a red dash the goal. Prints the same as text, with a verdict: met
when the whole bar is at or below the goal, not met when all of it is above, else within the
noise. With --markdown it also writes the verdicts and the chart as the page's `make goals`
section, replacing the one it has (bench/doc_sections.py).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import median_interval  # noqa: E402
from report import HTTP_GOALS, PROXY_GOALS, TLS_GOALS  # noqa: E402
from doc_sections import chart_link, write_section  # noqa: E402


def comparisons(results, key_of, goals, spindle="spindle", variant=""):
    """(label, paired ratios, goal) for each result of `spindle`'s (a benchmark's name for a
    spindle variant, "spindle+huge" for one) that has a goal; `variant` names the build the
    file measured, if it is not the one the rest did."""
    by = {(r["server"], key_of(r)): r for r in results}
    out = []
    for name, (goal, peer) in goals.items():
        name = name.strip()  # PROXY_GOALS pads repeated set-ups with spaces to keep them apart
        a, b = by.get((spindle, name)), by.get((peer, name))
        if not a or not b:
            continue
        pairs = [x / y for x, y in zip(a.get("round_cpu_us", []), b.get("round_cpu_us", []))
                 if x and y]
        if pairs:
            who = f"{variant} " if variant else "" if spindle == "spindle" else spindle + " "
            out.append((f"{name}\n{who}/ {peer}",
                        pairs, goal))
    return out


def results_of(path):
    """The results of a benchmark's --out file, or exit saying why it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)["results"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"goals_chart.py: cannot read results from {path}: {e!r}")


def verdicts(rows):
    """(label, median, low, high, rounds, goal, verdict, interval?) for each comparison: the
    median of its paired ratios with the 90% interval (the rounds' range below five rounds), and
    the verdict: met when the whole interval is at or below the goal, not met when all of it is
    above, else within the noise."""
    out = []
    for label, pairs, goal in rows:
        interval = median_interval(pairs)
        mid, low, high = interval or (statistics.median(pairs), min(pairs), max(pairs))
        verdict = "met" if high <= goal else "not met" if low > goal else "within the noise"
        out.append((label, mid, low, high, len(pairs), goal, verdict, bool(interval)))
    return out


def goals_section(judged, chart, markdown, command):
    """The page's `make goals` section: when and how it was measured, the chart, and a row a
    comparison."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    md = ["## Issue 24's goals (`make goals`)\n",
          f"- Run: {datetime.date.today().isoformat()}, commit `{commit}`; command: "
          f"`{command}`",
          "- Each comparison takes turns with its peer round by round, one worker each. The "
          "ratio is spindle's CPU a request over the peer's: the median of the rounds' paired "
          "ratios, with the interval that holds its true median nine times in ten (the rounds' "
          "range below five rounds). A goal is met when the whole interval is at or below it, "
          "not met when all of it is above, else within the noise (docs/performance.md, \"How "
          "to measure\").\n",
          chart_link("Issue 24's goals", chart, markdown) + "\n",
          "| comparison | spindle / peer | interval | rounds | goal | verdict |",
          "|---|---:|---|---:|---:|---|"]
    for label, mid, low, high, rounds, goal, verdict, interval in judged:
        spread = f"{low:.2f}–{high:.2f}" + ("" if interval else " (range)")
        md.append(f"| {label.replace(chr(10), ' ')} | {mid:.2f}x | {spread} | {rounds} | "
                  f"≤ {goal}x | {verdict} |")
    return md


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tls")
    p.add_argument("--proxy", action="append", default=[],
                   help="bench/proxy_compare.py's --out, as many times as there are files (a "
                        "c100 run and a c500 run, say)")
    p.add_argument("--http", action="append", default=[],
                   help="bench/http_compare.py's --out; LABEL=FILE for a file measuring another "
                        "build (e.g. canned=floor.json), given as many times as there are files")
    p.add_argument("--out", required=True)
    p.add_argument("--spindle", default="spindle",
                   help="the spindle variant to compare (e.g. spindle+huge), as the files name it")
    p.add_argument("--title", default="spindle's CPU per request over the peer's, issue 24's goals")
    p.add_argument("--markdown", help="the page whose `make goals` section to write (replaced)")
    p.add_argument("--command", default="bench/goals.sh",
                   help="with --markdown: the command that measured the files, as the page says")
    a = p.parse_args()
    rows = []
    if a.tls:
        rows += comparisons(results_of(a.tls), lambda r: r["workload"], TLS_GOALS,
                            a.spindle)
    if a.proxy:
        rows += comparisons([r for path in a.proxy for r in results_of(path)],
                            lambda r: f"{r['setup']} c{r['connections']}", PROXY_GOALS, a.spindle)
    for item in a.http:
        variant, _, path = item.rpartition("=") if not os.path.exists(item) else ("", "", item)
        rows += comparisons(results_of(path), lambda r: r["workload"],
                            HTTP_GOALS, a.spindle, variant)
    if not rows:
        sys.exit("goals_chart.py: no comparison with a goal in the files given")
    judged = verdicts(rows)
    fig, ax = plt.subplots(figsize=(12, 4.8))
    for i, (label, mid, low, high, rounds, goal, verdict, interval) in enumerate(judged):
        ax.errorbar([i], [mid], yerr=[[mid - low], [high - mid]], fmt="o", capsize=4,
                    color="#4472c4", elinewidth=2 if interval else 0.8)
        ax.plot([i - 0.3, i + 0.3], [goal, goal], color="#c00000", linewidth=2)
        spread = "90% interval" if interval else "the rounds' range"
        print(f"{label.replace(chr(10), ' ')}: {mid:.2f}x ({spread} {low:.2f}-{high:.2f}, "
              f"{rounds} rounds), goal {goal}x: {verdict}")
    ax.axhline(1.0, color="#a5a5a5", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_ylabel("spindle / peer, CPU per request (lower is better)")
    ax.set_title(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    if a.markdown:
        write_section(a.markdown, "make goals", "bench/goals_chart.py",
                      goals_section(judged, a.out, a.markdown, a.command))


if __name__ == "__main__":
    main()
