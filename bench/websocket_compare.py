#!/usr/bin/env python3
"""WebSocket echo through a gateway: spindle against haproxy, one worker each, in the same run.

The clients (bench/wsload, Go, built here) open WebSockets over HTTP/1.1 (GET with Upgrade)
or over HTTP/2 in cleartext (RFC 8441 extended CONNECT), each keeping 4 messages of 64 B or
16 KiB in flight; the upstream (http_test_server's /ws) echoes the bytes. The gateway is
pinned to CPU 0, the upstream and the clients share CPU 1. For each run the gateway's CPU
time is divided by the messages echoed (each crossed it twice): µs per message, and the ratio
to haproxy. Loopback only; every process started here is stopped by PID.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import (ROOT, cpu_seconds, free_port, median_round, pin, stop,  # noqa: E402
                          wait_listening)
from results_file import write_results  # noqa: E402

CLIENTS = ["h1", "h2"]
SIZES = [64, 16384]


def build_wsload(out_dir):
    go = shutil.which("go")
    if not go:
        sys.exit("websocket_compare: Go is not installed (make bench installs golang-go)")
    binary = os.path.join(out_dir, "wsload")
    subprocess.run([go, "build", "-o", binary, "."], cwd=os.path.join(ROOT, "bench", "wsload"),
                   check=True, env={**os.environ, "GOFLAGS": "-mod=mod"})
    return binary


def start_upstream(binaries):
    port = free_port()
    proc = subprocess.Popen(pin(1, 1) + [os.path.join(binaries, "http_test_server"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "UPSTREAM_NAME": "ws"})
    wait_listening(port, proc)
    return proc, port


def start_spindle(binaries, tmp, upstream):
    port = free_port()
    config = os.path.join(tmp, "spindle.yaml")
    with open(config, "w") as f:
        f.write(f"""servers:
  - listen: 127.0.0.1:{port}
    http2: true
    default_site: false
    compression: false
    access_log: off
routes:
  - {{name: ws, match: {{path_prefix: /}}, service: up}}
services:
  up: {{url: "http://127.0.0.1:{upstream}", timeouts: {{idle: 60s}}}}
""")
    proc = subprocess.Popen(pin(0, 1) + [os.path.join(binaries, "spindle"), "serve", "--config",
                                         config, "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port, port


def start_haproxy(binaries, tmp, upstream):
    h1, h2 = free_port(), free_port()
    conf = os.path.join(tmp, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(f"""global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout tunnel 60s
frontend f
  bind 127.0.0.1:{h1}
  bind 127.0.0.1:{h2} proto h2
  default_backend up
backend up
  server s1 127.0.0.1:{upstream}
""")
    proc = subprocess.Popen(pin(0, 1) + ["haproxy", "-f", conf, "-db"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, h1, h2


GATEWAYS = {"spindle": start_spindle, "haproxy": start_haproxy}


def run(kind, binaries, wsload, client, size, connections, seconds, tmp, upstream):
    proc, h1, h2 = GATEWAYS[kind](binaries, tmp, upstream)
    port = h2 if client == "h2" else h1
    try:
        wait_listening(h1, proc)
        wait_listening(h2, proc)
        before = cpu_seconds(proc.pid)
        user_before = cpu_seconds(proc.pid, user_only=True)
        out = subprocess.run(pin(1, 1) + [wsload, "-addr", f"127.0.0.1:{port}", "-proto", client,
                                          "-c", str(connections), "-size", str(size), "-d",
                                          f"{seconds}s"],
                             capture_output=True, text=True, timeout=seconds + 60)
        after, user_after = cpu_seconds(proc.pid), cpu_seconds(proc.pid, user_only=True)
        counts = json.loads(out.stdout.strip().splitlines()[-1])
        messages = counts["messages"]
        return {"messages": messages, "errors": counts["errors"],
                "messages_per_second": messages / seconds,
                "cpu_us_per_request": (after - before) * 1e6 / messages if messages else None,
                "user_us_per_request": ((user_after - user_before) * 1e6 / messages
                                        if messages else None)}
    finally:
        stop(proc)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "bin"))
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="keep the median round by CPU/message")
    p.add_argument("--connections", type=int, default=50)
    a = p.parse_args()
    for tool in ("haproxy", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"websocket_compare: {tool} is not installed (make bench installs it)")
    tools = tempfile.mkdtemp(prefix="spindle-bench-wsload-")
    wsload = build_wsload(tools)
    upstream, up_port = start_upstream(a.bin)
    results = []
    try:
        plan = [(c, s, g) for c in CLIENTS for s in SIZES for g in GATEWAYS]
        for i, (client, size, kind) in enumerate(plan, 1):
            print(f"  [{i}/{len(plan)}] {kind}, {client} client, {size} B messages", flush=True)
            rounds = []
            for _ in range(a.rounds):
                with tempfile.TemporaryDirectory() as tmp:
                    rounds.append(run(kind, a.bin, wsload, client, size, a.connections,
                                      a.seconds, tmp, up_port))
            r = median_round(rounds)
            r.update({"server": kind, "client": client, "size": size,
                      "connections": a.connections})
            print(f"      {r['messages_per_second']:>10,.0f} msg/s  CPU "
                  f"{r['cpu_us_per_request'] or 0:.2f} us/msg (user "
                  f"{r['user_us_per_request'] or 0:.2f})  errors {r['errors']}", flush=True)
            results.append(r)
    finally:
        stop(upstream)
        shutil.rmtree(tools, ignore_errors=True)
    by = {(r["server"], r["client"], r["size"]): r for r in results}
    print("\n  gateway CPU per echoed message, spindle's ratio to haproxy:")
    for client in CLIENTS:
        for size in SIZES:
            s, h = by.get(("spindle", client, size)), by.get(("haproxy", client, size))
            if s and h and s["cpu_us_per_request"] and h["cpu_us_per_request"]:
                print(f"    {client} {size:>6} B  spindle {s['cpu_us_per_request']:6.2f} us  "
                      f"haproxy {h['cpu_us_per_request']:6.2f} us  "
                      f"{s['cpu_us_per_request'] / h['cpu_us_per_request']:.2f}x")
    write_results(a.out, {"seconds": a.seconds, "rounds": a.rounds, "results": results}, indent=2)


if __name__ == "__main__":
    main()
