#!/usr/bin/env python3
"""Memory of idle keep-alive connections: spindle and nginx, one worker each, same run.

Opens N connections one after another (each sends one request and reads the answer, then
stays open and idle) and reports the server's RSS growth per connection (VmRSS of the server
and its children, /proc). Loopback only; every process started here is stopped by PID.
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_compare  # noqa: E402  (server start-up and process helpers)

REQUEST = b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n"


def rss(pid):
    total = 0
    for p in http_compare.process_tree(pid):
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def one_request(sock):
    sock.sendall(REQUEST)
    data = b""
    while b"Hello, World!" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk


def measure(kind, binaries, count):
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        proc, port = http_compare.SERVERS[kind](binaries, 1, tmp)
        conns = []
        try:
            http_compare.wait_listening(port, proc)
            for _ in range(50):  # warm-up: pools, arenas, caches
                with socket.create_connection(("127.0.0.1", port)) as s:
                    one_request(s)
            time.sleep(0.3)
            before = rss(proc.pid)
            for i in range(count):
                s = socket.create_connection(("127.0.0.1", port))
                one_request(s)
                conns.append(s)
                if (i + 1) % 2000 == 0:
                    print(f"    {kind}: {i + 1} idle connections", flush=True)
            time.sleep(0.5)
            after = rss(proc.pid)
            return {"server": kind, "connections": count, "rss_before": before,
                    "rss_after": after, "bytes_per_connection": (after - before) / count}
        finally:
            for s in conns:
                s.close()
            http_compare.stop(proc)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(http_compare.ROOT, "build", "release", "bin"))
    p.add_argument("--out", required=True)
    p.add_argument("--connections", type=int, default=10000)
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < a.connections + 100:
        sys.exit(f"idle_rss: needs {a.connections + 100} open files; ulimit -n hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = []
    for kind in ("spindle", "nginx"):
        r = measure(kind, a.bin, a.connections)
        print(f"  {kind}: {r['bytes_per_connection']:.0f} bytes RSS per idle connection", flush=True)
        results.append(r)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
