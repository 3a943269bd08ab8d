#!/usr/bin/env python3
"""The gateway under the loads users meet besides the easy one: spindle against nginx, haproxy
and h2o as reverse proxies (HTTP/1.1 to HTTP/1.1, one worker each, their configurations of
bench/proxy_compare.py; spindle+1024 is spindle with `limits.max_connections: 1024` instead of
256), in front of one upstream (bench/loadpeer, Go's net/http, built here):

  slow upstream   every answer comes 50 ms late; wrk -c1000 (a thousand requests waiting at
                  the gateway at once)
  1 MB download   1,000,000-byte answers; wrk -c50
  1 MB upload     1,000,000-byte POST bodies, a short answer; wrk -c50
  close           a new connection for every request, a thousand at a time (wrk -c1000,
                  Connection: close): connections arriving all at once, again and again
  slow clients    300 connections each reading 1,000,000-byte answers at 256 KB/s, and beside
                  them 10 fast clients asking for /plaintext (wrk -c10): whether slow readers
                  hold the gateway's memory or its upstream connections, and keep the others
                  waiting

For each: requests/s, the gateway's CPU per request (utime + stime of it and its children,
/proc/PID/stat), its peak resident memory (VmHWM) and the errors (wrk's, and non-2xx answers);
for slow clients, the fast clients' requests/s and 99th percentile instead of a CPU figure (the
gateway's CPU there serves both kinds of client at once: the download row has the cost of a
large answer). The gateway runs on CPU 0; the upstream and the load
on CPU 1. Each round starts a fresh gateway; the gateways take turns round by round, and the
median round (by CPU) is kept. Loopback only; every process started here is stopped by PID.

  bench/hard_loads.py --out bench/results/hard-loads.json [--rounds 3] [--seconds 5]
      [--gateways spindle,spindle+1024,nginx,haproxy,h2o] [--workloads "slow upstream,close"] [--bars PNG]
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import (ROOT, free_port, median_round, parse_wrk,  # noqa: E402
                          peak_rss_mb, pin, ratio_text, stop, wait_listening)
from proxy_compare import GATEWAYS  # noqa: E402
from results_file import write_results  # noqa: E402
from tls_compare import measure  # noqa: E402

BODY = 1_000_000  # bytes of a large answer or upload (below every gateway's default limit)
SLOW_CLIENTS = 300
SLOW_RATE = 256_000  # bytes a second each slow client reads
UPLOAD_LUA = f"""wrk.method = "POST"
wrk.body = string.rep("a", {BODY})
wrk.headers["Content-Type"] = "application/octet-stream"
"""

WORKLOADS = [  # name, path, connections, extra wrk arguments
    ("slow upstream", "/delay/50", 1000, []),
    ("1 MB download", f"/bytes/{BODY}", 50, []),
    ("1 MB upload", "/upload", 50, ["-s", "{upload_lua}"]),
    ("close", "/plaintext", 1000, ["-H", "Connection: close"]),
    ("slow clients", f"/bytes/{BODY}", SLOW_CLIENTS, []),
]
NEEDED_FILES = 4096  # wrk -c1000 through a gateway: a client and an upstream socket each


def build_peer(out_dir):
    binary = os.path.join(out_dir, "loadpeer")
    env = {**os.environ, "CGO_ENABLED": "0"}
    subprocess.run(["go", "build", "-o", binary, "."], cwd=os.path.join(ROOT, "bench", "loadpeer"),
                   env=env, check=True)
    return binary


def start_upstream(peer):
    port = free_port()
    proc = subprocess.Popen(pin(1, 1) + [peer, "upstream", "-listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, proc)
    return proc, port


def slow_clients(peer, base, seconds):
    """SLOW_CLIENTS slow readers of BODY-byte answers for `seconds`, with wrk -c10 asking for
    /plaintext beside them from the second second: the slow clients' tally and the fast ones'
    wrk result."""
    started = time.monotonic()
    slow = subprocess.Popen(pin(1, 1) + [peer, "slowclients", "-url", f"{base}/bytes/{BODY}",
                                         "-connections", str(SLOW_CLIENTS), "-rate",
                                         str(SLOW_RATE), "-seconds", str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    fast = subprocess.run(pin(1, 1) + ["wrk", "-t1", "-c10", f"-d{max(1, seconds - 2)}s",
                                       "--latency", "--timeout", "5s", f"{base}/plaintext"],
                          capture_output=True, text=True, timeout=seconds + 60)
    out, _ = slow.communicate(timeout=seconds + 120)
    elapsed = time.monotonic() - started  # each slow client finishes the answer it is reading
    tally = json.loads(out) if slow.returncode == 0 and out.strip() else \
        {"responses": 0, "bytes": 0, "errors": 1}
    result = parse_wrk(fast.stdout)
    if fast.returncode != 0:
        result["errors"] += 1
    return {
        "requests": tally["responses"],
        "rps": tally["responses"] / elapsed,
        "errors": tally["errors"] + result["errors"],
        "slow_bytes": tally["bytes"],
        "cpu_us_per_request": None,
        "fast_rps": result["rps"],
        "fast_p99_ms": result["p99_ms"],
        "fast_errors": result["errors"],
    }


def run(kind, binaries, workload, seconds, tmp, certs, upstream_port, peer):
    name, path, connections, extra = workload
    proc, plain, tls = GATEWAYS[kind](binaries, tmp, certs, upstream_port, 0, "h1")
    try:
        wait_listening(plain, proc)
        base = f"http://127.0.0.1:{plain}"
        if name == "slow clients":
            result = slow_clients(peer, base, seconds)
        else:
            lua = os.path.join(tmp, "upload.lua")
            with open(lua, "w") as f:
                f.write(UPLOAD_LUA)
            extra = [x.replace("{upload_lua}", lua) for x in extra]
            # A short warm-up of the same shape: the gateway's upstream pool at its steady size.
            measure(proc.pid, "wrk", base + path, min(connections, 100), 1, extra)
            result = measure(proc.pid, "wrk", base + path, connections, seconds, extra)
        result["peak_rss_mb"] = peak_rss_mb(proc.pid)
        if proc.poll() is not None:
            result["errors"] += 1  # the gateway died under the load
        return result
    finally:
        stop(proc)


def median(rounds):
    """The median round: by CPU per request, or for slow clients by the fast clients' p99."""
    if all(r["cpu_us_per_request"] is None for r in rounds):
        return sorted(rounds, key=lambda r: r["fast_p99_ms"] or 0)[len(rounds) // 2]
    return median_round(rounds)


def row_text(kind, r, spindle):
    cpu = r["cpu_us_per_request"]
    text = (f"    {kind:12} {r['rps']:9.0f} req/s  {cpu:8.2f} µs/req" if cpu else
            f"    {kind:12} {r['rps']:9.0f} req/s  {'-':>8} µs/req")
    text += f"  peak {r['peak_rss_mb']:6.1f} MiB  errors {r['errors']}"
    if "fast_rps" in r:
        p99 = r["fast_p99_ms"]
        text += (f"  | fast clients {r['fast_rps']:.0f} req/s, p99 "
                 f"{p99 if p99 is not None else float('nan'):.1f} ms")
    if spindle is not None and kind != "spindle" and cpu and spindle["cpu_us_per_request"]:
        text += f"  (spindle {ratio_text(spindle, r)})"
    return text


def bars(results, path):
    """Three panels: requests/s and CPU a request, each relative to spindle's, and peak
    memory; for slow clients the requests/s are the fast clients' (and no CPU figure)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [w[0] for w in WORKLOADS if any(r["workload"] == w[0] for r in results)]
    kinds = list(dict.fromkeys(r["gateway"] for r in results))

    def find(name, kind):
        return next((r for r in results if r["workload"] == name and r["gateway"] == kind), None)

    def rate(r):
        return r.get("fast_rps", r["rps"]) if r else 0

    def relative(r, base, key):
        ok = r and base and key(r) and key(base)
        return key(r) / key(base) if ok else 0

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    width = 0.8 / max(1, len(kinds))
    for k, kind in enumerate(kinds):
        xs = [i + k * width for i in range(len(names))]
        rows = [(find(n, kind), find(n, "spindle")) for n in names]
        axes[0].bar(xs, [relative(r, b, rate) for r, b in rows], width, label=kind)
        axes[1].bar(xs, [relative(r, b, lambda x: x["cpu_us_per_request"]) for r, b in rows],
                    width, label=kind)
        axes[2].bar(xs, [r["peak_rss_mb"] if r else 0 for r, _ in rows], width, label=kind)
    for ax, title in ((axes[0], "requests/s relative to spindle (slow clients: the fast ones')"),
                      (axes[1], "CPU a request relative to spindle (lower is cheaper)"),
                      (axes[2], "peak resident memory, MiB")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
        ax.set_xticklabels(names, rotation=20, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "bin"))
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gateways", default="spindle,spindle+1024,nginx,haproxy,h2o")
    p.add_argument("--workloads", default="", help="only these, by name (comma-separated)")
    p.add_argument("--bars", help="draw CPU (relative to spindle) and peak memory into this PNG")
    p.add_argument("--replot", action="store_true", help="draw --bars from --out; measure nothing")
    a = p.parse_args()
    if a.replot:
        with open(a.out) as f:
            bars(json.load(f)["results"], a.bars)
        return
    for tool in ("go", "wrk", "nginx", "haproxy", "h2o", "taskset", "openssl"):
        if not shutil.which(tool):
            sys.exit(f"hard_loads: {tool} is not installed (make bench installs it)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < NEEDED_FILES:
        sys.exit(f"hard_loads: needs {NEEDED_FILES} open files (wrk -c1000 through a gateway); "
                 f"the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    workloads = [w for w in WORKLOADS if not a.workloads or w[0] in a.workloads.split(",")]
    gateways = a.gateways.split(",")
    results = []
    work = tempfile.mkdtemp(prefix="spindle-hard-loads-")
    os.chmod(work, 0o755)
    upstream = None
    try:
        certs = os.path.join(work, "certs")
        os.makedirs(certs)
        subprocess.run([os.path.join(ROOT, "tests", "tls", "make-certs.sh"), certs], check=True,
                       stdout=subprocess.DEVNULL)
        peer = build_peer(work)
        upstream, upstream_port = start_upstream(peer)
        for i, workload in enumerate(workloads, 1):
            rounds = {kind: [] for kind in gateways}
            for n in range(a.rounds):
                for kind in gateways:
                    print(f"  [{i}/{len(workloads)}] {workload[0]}, round {n + 1}/{a.rounds}: "
                          f"{kind}", flush=True)
                    with tempfile.TemporaryDirectory(dir=work) as tmp:
                        # nginx's workers (nobody) write request bodies there (client_body_temp_path)
                        os.chmod(tmp, 0o777)
                        rounds[kind].append(run(kind, a.bin, workload, a.seconds, tmp, certs,
                                                upstream_port, peer))
            print(f"  {workload[0]} ({workload[2]} connections):")
            spindle = median(rounds["spindle"]) if rounds.get("spindle") else None
            for kind in gateways:
                r = spindle if kind == "spindle" and spindle else median(rounds[kind])
                r.update(gateway=kind, workload=workload[0], connections=workload[2])
                results.append(r)
                print(row_text(kind, r, spindle), flush=True)
            write_results(a.out, {"seconds": a.seconds, "rounds": a.rounds, "results": results})
        if a.bars:
            bars(results, a.bars)
    finally:
        if upstream:
            stop(upstream)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
