#!/usr/bin/env python3
"""Two spindle builds under the same load, turn about: is a change cheaper?

This machine is shared and noisy: CPU per request moves by a tenth or more between runs
minutes apart, more than most single changes save. Both servers run at once (each one worker,
both pinned to CPU 0, the load generator to CPU 1), and the load goes to A, then B, then A...,
so that whatever else the machine does falls on both alike. Prints each round and the median
of the rounds' B/A ratios of CPU per request (total and user), with the interval that holds
the true median nine times in ten (from five rounds; http_compare.median_interval).

  bench/ab_compare.py --a /tmp/before/bin --b build/release/bin --workload "h2c c100 m10"

A workload is one of bench/tls_compare.py's ("h2c c100 m10", "h2 TLS c100 m10", ...), "http
keep-alive c100" (HTTP/1.1 in clear, wrk), or a
proxy set-up of bench/proxy_compare.py with its connections ("h2tls->h1 c500": both gateways
proxy to one nginx upstream). Loopback only; every process started here is stopped by PID.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import (ROOT, browser_headers, median_interval, stop,  # noqa: E402
                          wait_listening)
from proxy_compare import SETUPS, WARM_UP_SECONDS, start_upstream  # noqa: E402
from proxy_compare import start_spindle as start_gateway  # noqa: E402
from tls_compare import WORKLOADS, measure, start_spindle  # noqa: E402

# HTTP/1.1 in clear, which tls_compare's peers do not serve on their cleartext (h2c) port.
OWN_WORKLOADS = [("http keep-alive c100", "wrk", "http", []),
                 ("http keep-alive c100 browser", "wrk", "http", browser_headers())]


def find_workload(text):
    """(tool, scheme, connections, start(folder, tmp, certs, upstream)) for `text`, or None."""
    for name, tool, scheme, extra in WORKLOADS + OWN_WORKLOADS:
        if name == text:
            return tool, scheme, 100, extra, lambda folder, tmp, certs, _: start_spindle(
                folder, tmp, certs)
    setup_name, _, connections = text.rpartition(" c")
    for name, tool, scheme, upstream_protocol in SETUPS:
        if name == setup_name and connections.isdigit():
            def start(folder, tmp, certs, upstream, protocol=upstream_protocol):
                proc, plain, tls = start_gateway(folder, tmp, certs, upstream[1], upstream[2],
                                                 protocol)
                return proc, tls, plain
            return tool, scheme, int(connections), [], start
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True, help="folder holding the first spindle binary")
    p.add_argument("--b", default=os.path.join(ROOT, "build", "release", "bin"))
    p.add_argument("--workload", default="h2c c100 m10")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seconds", type=int, default=3)
    a = p.parse_args()
    workload = find_workload(a.workload)
    if workload is None:
        sys.exit(f"unknown workload {a.workload!r}: one of {[w[0] for w in WORKLOADS + OWN_WORKLOADS]}, or a "
                 f"set-up of {[s[0] for s in SETUPS]} with its connections (\"h2tls->h1 c500\")")
    tool, scheme, connections, extra, start = workload
    name = a.workload
    for tool_name in (tool, "taskset", "openssl"):
        if shutil.which(tool_name) is None:
            sys.exit(f"{tool_name} is needed (apt-get install nghttp2-client wrk util-linux)")
    tmp = tempfile.mkdtemp(prefix="spindle-ab-")
    certs = os.path.join(tmp, "certs")
    subprocess.run([os.path.join(ROOT, "tests", "tls", "make-certs.sh"), certs], check=True,
                   stdout=subprocess.DEVNULL)
    os.chmod(tmp, 0o755)
    servers = {}
    upstream = None
    try:
        if "->" in a.workload:
            os.makedirs(os.path.join(tmp, "upstream"))
            upstream = start_upstream(os.path.join(tmp, "upstream"), certs)
        for side, folder in (("A", a.a), ("B", a.b)):
            os.makedirs(os.path.join(tmp, side))
            proc, tls_port, plain_port = start(folder, os.path.join(tmp, side), certs, upstream)
            servers[side] = (proc, tls_port if scheme == "https" else plain_port)
            wait_listening(tls_port, proc)
            wait_listening(plain_port, proc)
            if upstream is not None:  # the upstream pool in its steady state first
                measure(proc.pid, tool, f"{scheme}://127.0.0.1:{servers[side][1]}/plaintext",
                        connections, WARM_UP_SECONDS, extra)
        ratios, user_ratios = [], []
        for i in range(a.rounds):
            got = {}
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                proc, port = servers[side]
                got[side] = measure(proc.pid, tool, f"{scheme}://127.0.0.1:{port}/plaintext",
                                    connections, a.seconds, extra)
            if got["A"]["errors"] or got["B"]["errors"]:
                print(f"  round {i + 1}: errors A {got['A']['errors']} B {got['B']['errors']}")
            ratio = got["B"]["cpu_us_per_request"] / got["A"]["cpu_us_per_request"]
            user = got["B"]["user_us_per_request"] / got["A"]["user_us_per_request"]
            ratios.append(ratio)
            user_ratios.append(user)
            print(f"  round {i + 1}/{a.rounds}: A {got['A']['cpu_us_per_request']:.3f} us/req "
                  f"(user {got['A']['user_us_per_request']:.3f})  B "
                  f"{got['B']['cpu_us_per_request']:.3f} (user "
                  f"{got['B']['user_us_per_request']:.3f})  B/A {ratio:.3f}", flush=True)
        interval = median_interval(ratios)
        print(f"{name}: B/A CPU per request, median of {a.rounds} rounds: "
              f"{statistics.median(ratios):.3f} (user {statistics.median(user_ratios):.3f})"
              + (f", 90% interval {interval[1]:.3f}-{interval[2]:.3f}" if interval else ""))
    finally:
        for proc, _ in servers.values():
            stop(proc)
        if upstream is not None:
            stop(upstream[0])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
