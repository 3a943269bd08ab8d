#!/usr/bin/env python3
"""Memory of idle keep-alive connections: spindle and nginx (and h2o), one worker each, same
run; HTTP/1.1, or with --protocol h2 HTTP/2 by prior knowledge (h2c: the preface, SETTINGS, one
GET /plaintext on stream 1, the server's SETTINGS acknowledged, then idle).

Two ways for N connections to arrive, each measured on a fresh server:
- sequential: opened one after another; each sends one request, reads the answer, stays open;
- burst: all N opened first, then each sends its first request at about the same moment
  (one pass over the sockets), and the answers are read as they come.
Then the connections stay idle and the server's RSS growth per connection is taken (VmRSS of
the server and its children, /proc) after a few seconds of quiet; then they all close and the
RSS is followed until it is back within 10% of its level before (or a time limit passes).
Loopback only; every process started here is stopped by PID.
"""
import argparse
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_compare  # noqa: E402  (server start-up and process helpers)
from results_file import write_results  # noqa: E402

REQUEST = b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n"


def h2_request():
    """The client preface, an empty SETTINGS, and GET /plaintext on stream 1 (HPACK by hand:
    indexed :method GET and :scheme http, literal :path and :authority without indexing)."""
    block = bytes([0x82, 0x86, 0x04, len(b"/plaintext")]) + b"/plaintext"
    block += bytes([0x01, 1]) + b"x"
    headers = len(block).to_bytes(3, "big") + bytes([0x1, 0x5]) + (1).to_bytes(4, "big") + block
    settings = bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])
    return b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings + headers


H2_SETTINGS_ACK = bytes([0, 0, 0, 0x4, 0x1, 0, 0, 0, 0])


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


def one_request(sock, request=REQUEST):
    sock.sendall(request)
    data = b""
    while b"Hello, World!" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    if request is not REQUEST:
        sock.sendall(H2_SETTINGS_ACK)


def open_sequential(port, count, kind, request):
    conns = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        conns.append(s)
        one_request(s, request)
        if (i + 1) % 2000 == 0:
            print(f"    {kind}: {i + 1} idle connections", flush=True)
    return conns


def open_burst(port, count, kind, request):
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    print(f"    {kind}: {count} connections open; every one sends its request now", flush=True)
    for s in conns:
        s.sendall(request)
    selector = selectors.DefaultSelector()
    received = {}
    for s in conns:
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
        received[s] = b""
    waiting, deadline = count, time.monotonic() + 60
    while waiting and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1):
            data = key.fileobj.recv(4096)
            if not data:
                raise ConnectionError("closed before answering")
            received[key.fileobj] += data
            if b"Hello, World!" in received[key.fileobj]:
                selector.unregister(key.fileobj)
                if request is not REQUEST:
                    key.fileobj.setblocking(True)
                    key.fileobj.sendall(H2_SETTINGS_ACK)
                waiting -= 1
    if waiting:
        raise TimeoutError(f"{waiting} of {count} requests unanswered after 60 s")
    print(f"    {kind}: all {count} answered", flush=True)
    return conns


def measure(kind, binaries, count, arrival, protocol, certs):
    request = REQUEST if protocol == "h1" else h2_request()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        if protocol == "h1":
            proc, port = http_compare.SERVERS[kind](binaries, 1, tmp)
        else:
            import tls_compare  # its servers listen for h2c on their plain port
            proc, _, port = tls_compare.SERVERS[kind](binaries, tmp, certs)
        conns = []
        try:
            http_compare.wait_listening(port, proc)
            for _ in range(50):  # warm-up: pools, arenas, caches
                with socket.create_connection(("127.0.0.1", port)) as s:
                    one_request(s, request)
            time.sleep(3)
            before = rss(proc.pid)
            opener = open_sequential if arrival == "sequential" else open_burst
            conns = opener(port, count, kind, request)
            time.sleep(3)  # quiet: what the server keeps for idle connections
            idle = rss(proc.pid)
            for s in conns:
                s.close()
            conns = []
            closed_at = time.monotonic()
            after = rss(proc.pid)
            while after > before * 1.1 and time.monotonic() - closed_at < 10:
                time.sleep(0.25)
                after = rss(proc.pid)
            return {"server": kind, "arrival": arrival, "protocol": protocol,
                    "connections": count,
                    "rss_before": before, "rss_after": idle,
                    "bytes_per_connection": (idle - before) / count,
                    "rss_after_close": after,
                    "seconds_to_recover": round(time.monotonic() - closed_at, 2)}
        finally:
            for s in conns:
                s.close()
            http_compare.stop(proc)


def chart(results, path, baseline=None):
    """Bars of bytes per idle connection, by server and arrival (and, with `baseline`, a
    JSON of an earlier run, spindle's bars of that run beside them)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = []
    if baseline:
        with open(baseline) as f:
            rows += [dict(r, server="spindle (before)") for r in json.load(f)
                     if r["server"] == "spindle"]
    rows += results
    servers = list(dict.fromkeys(r["server"] for r in rows))
    arrivals = ("sequential", "burst")
    by = {(r["server"], r["arrival"]): r["bytes_per_connection"] for r in rows}
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(servers)
    for i, server in enumerate(servers):
        values = [by.get((server, a), 0) / 1024 for a in arrivals]
        bars = ax.bar([x + (i - (len(servers) - 1) / 2) * width for x in range(len(arrivals))],
                      values, width, label=server)
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(arrivals)), arrivals)
    ax.set_ylabel("KiB of RSS per idle connection (lower is better)")
    protocol = rows[-1]["protocol"]
    ax.set_title(f"Idle {'HTTP/2 (h2c)' if protocol == 'h2' else 'HTTP/1.1'} connections, "
                 f"{rows[-1]['connections']} of them, one worker")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(http_compare.ROOT, "build", "release", "bin"))
    p.add_argument("--out", required=True)
    p.add_argument("--connections", type=int, default=10000)
    p.add_argument("--protocol", choices=["h1", "h2"], default="h1",
                   help="h2: HTTP/2 by prior knowledge, against h2o too")
    p.add_argument("--chart", help="draws the results as bars into this PNG")
    p.add_argument("--before", help="with --chart: an earlier run's JSON, spindle's bars beside")
    p.add_argument("--replot", action="store_true",
                   help="draws --chart from --out's JSON without measuring")
    a = p.parse_args()
    if a.replot:
        with open(a.out) as f:
            chart(json.load(f), a.chart, a.before)
        return
    servers = ("spindle", "nginx") if a.protocol == "h1" else ("spindle", "nginx", "h2o")
    certs = None
    if a.protocol == "h2":
        import shutil
        certs = tempfile.mkdtemp(prefix="spindle-bench-certs-")
        os.chmod(certs, 0o755)
        subprocess.run([os.path.join(http_compare.ROOT, "tests", "tls", "make-certs.sh"), certs],
                       check=True, capture_output=True)
        for f in os.listdir(certs):
            os.chmod(os.path.join(certs, f), 0o644)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < a.connections + 100:
        sys.exit(f"idle_rss: needs {a.connections + 100} open files; ulimit -n hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = []
    for arrival in ("sequential", "burst"):
        for kind in servers:
            print(f"  {kind}, {a.protocol}, {arrival}:", flush=True)
            r = measure(kind, a.bin, a.connections, arrival, a.protocol, certs)
            print(f"  {kind}, {arrival}: {r['bytes_per_connection']:.0f} bytes RSS per idle "
                  f"connection; {r['rss_before'] / 2**20:.1f} MiB before, "
                  f"{r['rss_after_close'] / 2**20:.1f} MiB {r['seconds_to_recover']} s after "
                  "closing", flush=True)
            results.append(r)
    by = {(r["server"], r["arrival"]): r["bytes_per_connection"] for r in results}
    for arrival in ("sequential", "burst"):
        for peer in servers[1:]:
            print(f"  {arrival}: spindle/{peer} = "
                  f"{by[('spindle', arrival)] / by[(peer, arrival)]:.2f}", flush=True)
    if certs:
        shutil.rmtree(certs)
    write_results(a.out, results, indent=2)
    if a.chart:
        chart(results, a.chart, a.before)


if __name__ == "__main__":
    main()
