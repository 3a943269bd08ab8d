#!/usr/bin/env python3
"""HTTPS and HTTP/2 load comparison: spindle against nginx and h2o, one worker each.

Workloads (same "Hello, World!" text/plain as bench/http_compare.py):
  h2 TLS c100 m10      h2load -c100 -m10 over TLS (ALPN h2)
  h2c c100 m10         h2load -c100 -m10 in cleartext (prior knowledge)
  https keep-alive     wrk -c100 over HTTPS/1.1
  https close          wrk -c100 with Connection: close (a handshake per request)
For each run the server's CPU time (utime + stime from /proc/PID/stat, with its children) is
divided by the requests served, and printed with the ratios to nginx and h2o. The server is
pinned to CPU 0 and the load generator to CPU 1. Loopback only; every process started here is
stopped by PID.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import (ROOT, SyscallCount, browser_headers, cpu_seconds, cpu_us_per_request,  # noqa: E402
                          free_port, median_round, parse_wrk, pin, ratio_text, stop,
                          wait_listening)
from results_file import write_results  # noqa: E402

WORKLOADS = [  # name, tool, scheme, extra arguments
    ("h2 TLS c100 m10", "h2load", "https", []),
    ("h2 TLS c100 m10 browser", "h2load", "https", browser_headers()),
    ("h2c c100 m10", "h2load", "http", []),
    ("https keep-alive c100", "wrk", "https", []),
    ("https close c100", "wrk", "https", ["-H", "Connection: close"]),
]


def start_spindle(binaries, tmp, certs, huge_page_stacks=False):
    tls_port, plain_port = free_port(), free_port()
    config = os.path.join(tmp, "spindle.yaml")
    with open(config, "w") as f:
        f.write(("huge_page_stacks: true\n" if huge_page_stacks else "") + f"""servers:
  - listen: 127.0.0.1:{tls_port}
    default_site: true
    compression: false
    access_log: off
    http2: true
    tls: {{cert: {certs}/localhost.pem, key: {certs}/localhost.key}}
  - listen: 127.0.0.1:{plain_port}
    default_site: true
    compression: false
    access_log: off
    http2: true
""")
    proc = subprocess.Popen(pin(0, 1) + [os.path.join(binaries, "spindle"), "serve", "--config",
                                         config, "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, tls_port, plain_port


def start_nginx(binaries, tmp, certs):
    tls_port, plain_port = free_port(), free_port()
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; master_process on; worker_processes 1;
pid {tmp}/nginx.pid; error_log {tmp}/nginx-error.log crit; worker_rlimit_nofile 20000;
events {{ worker_connections 16384; }}
http {{
  access_log off; server_tokens off; keepalive_requests 1000000;
  http2_max_requests 1000000;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};
  uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  ssl_certificate {certs}/localhost.pem; ssl_certificate_key {certs}/localhost.key;
  ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:10m;
  server {{
    listen 127.0.0.1:{tls_port} ssl http2 reuseport;
    listen 127.0.0.1:{plain_port} http2 reuseport;
    location = /plaintext {{ default_type text/plain; return 200 "Hello, World!"; }}
  }}
}}
""")
    proc = subprocess.Popen(pin(0, 1) + ["nginx", "-c", conf, "-p", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, tls_port, plain_port


def start_h2o(binaries, tmp, certs):
    tls_port, plain_port = free_port(), free_port()
    with open(os.path.join(tmp, "plaintext"), "w") as f:
        f.write("Hello, World!")
    conf = os.path.join(tmp, "h2o.conf")
    with open(conf, "w") as f:
        f.write(f"""num-threads: 1
listen:
  host: 127.0.0.1
  port: {tls_port}
  ssl:
    certificate-file: {certs}/localhost.pem
    key-file: {certs}/localhost.key
listen:
  host: 127.0.0.1
  port: {plain_port}
hosts:
  default:
    paths:
      /plaintext:
        file.file: {tmp}/plaintext
""")
    proc = subprocess.Popen(pin(0, 1) + ["h2o", "-c", conf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, tls_port, plain_port


SERVERS = {"spindle": start_spindle,
           "spindle+huge": lambda *args: start_spindle(*args, huge_page_stacks=True),
           "nginx": start_nginx, "h2o": start_h2o}


def parse_h2load(text):
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed,"
                     r" (\d+) errored", text)
    rps = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", text)
    succeeded = int(done.group(2)) if done else 0
    errors = (int(done.group(3)) + int(done.group(4))) if done else 1
    return {"requests": succeeded, "rps": float(rps.group(1)) if rps else 0.0, "p99_ms": None,
            "errors": errors}


def measure(pid, tool, url, connections, seconds, extra=()):
    """One load run against `url`, h2load (10 streams per connection) or wrk: its result, with
    the CPU per request of process `pid` (and its children) over the run."""
    result, _ = load(pid, tool, url, connections, seconds, extra)
    return result


def count_syscalls(pid, tool, url, connections, seconds, extra=()):
    """System calls per request of process `pid` over a run of its own: the count's tracepoint
    costs the kernel time on every call, so it is kept out of the runs that measure CPU."""
    result, syscalls = load(pid, tool, url, connections, seconds, extra, count=True)
    return syscalls.per_request(result["requests"])


def tcp_segments_sent():
    """TCP segments this machine has sent so far (/proc/net/snmp, Tcp OutSegs)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def load(pid, tool, url, connections, seconds, extra=(), count=False):
    with SyscallCount(pid if count else None) as syscalls:
        segments_before = tcp_segments_sent()
        before, user_before = cpu_seconds(pid), cpu_seconds(pid, user_only=True)
        if tool == "h2load":
            # A connection with nothing to show for 10 s ends (its requests count as failed):
            # a server that drops a request is then an error in its figures, not a run that
            # never ends (h2load waits for every request it sent, past -D).
            args = pin(1, 1) + ["h2load", f"-c{connections}", "-m10", "-t1", "-D", str(seconds),
                                "-N", "10", *extra, url]
            out = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
            result = parse_h2load(out.stdout)
        else:
            args = pin(1, 1) + ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                                "--timeout", "5s", *extra, url]
            out = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
            result = parse_wrk(out.stdout)
    after, user_after = cpu_seconds(pid), cpu_seconds(pid, user_only=True)
    # Every segment of the run crosses loopback once (client, gateway, upstream, ACKs included).
    # The same load can take very different counts: a process that reads each socket as soon as
    # data arrives acknowledges more often, so its peer sends each small write as a segment of
    # its own, and on loopback the sender pays for the receiver's side too
    # (docs/performance.md, "What a gateway's traffic costs the upstream").
    result["segments_per_request"] = ((tcp_segments_sent() - segments_before) / result["requests"]
                                      if result["requests"] else None)
    result["cpu_us_per_request"] = cpu_us_per_request(before, after, result["requests"])
    # The part spent in user space: the rest is the kernel's (the same system calls cost every
    # server about the same), so this is where servers differ by their own code.
    result["user_us_per_request"] = cpu_us_per_request(user_before, user_after,
                                                       result["requests"])
    if out.returncode != 0:
        result["errors"] += 1
    return result, syscalls


SYSCALL_SECONDS = 2  # the run that counts system calls, after the measured one


def syscalls_text(result):
    """`  N syscalls/req` for a result that has the count, else nothing."""
    n = result.get("syscalls_per_request")
    return f"  {n:.2f} syscalls/req" if n is not None else ""


def run(kind, binaries, workload, seconds, tmp, certs, syscalls=False):
    name, tool, scheme, extra = workload
    proc, tls_port, plain_port = SERVERS[kind](binaries, tmp, certs)
    port = tls_port if scheme == "https" else plain_port
    url = f"{scheme}://127.0.0.1:{port}/plaintext"
    try:
        wait_listening(tls_port, proc)
        wait_listening(plain_port, proc)
        result = measure(proc.pid, tool, url, 100, seconds, extra)
        if syscalls:
            result["syscalls_per_request"] = count_syscalls(proc.pid, tool, url, 100,
                                                            SYSCALL_SECONDS, extra)
        return result
    finally:
        stop(proc)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "bin"))
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="keep the median round by CPU/request")
    p.add_argument("--servers", default="spindle,nginx,h2o")
    p.add_argument("--workloads", default="", help="only these workloads, by name (comma-separated)")
    p.add_argument("--syscalls", action="store_true",
                   help="count each server's system calls per request in a run of its own "
                        "(perf stat on the raw_syscalls tracepoint: needs root)")
    a = p.parse_args()
    for tool in ("h2load", "wrk", "nginx", "h2o", "taskset", "openssl"):
        if not shutil.which(tool):
            sys.exit(f"tls_compare: {tool} is not installed (make bench installs it)")
    results = []
    # Certificates readable by h2o's unprivileged workers: a world-readable folder.
    certs = tempfile.mkdtemp(prefix="spindle-bench-certs-")
    try:
        os.chmod(certs, 0o755)
        subprocess.run([os.path.join(ROOT, "tests", "tls", "make-certs.sh"), certs], check=True)
        for f in os.listdir(certs):
            os.chmod(os.path.join(certs, f), 0o644)
        workloads = [wl for wl in WORKLOADS if not a.workloads or wl[0] in a.workloads.split(",")]
        servers = a.servers.split(",")
        for i, workload in enumerate(workloads, 1):
            # The servers take turns round by round (A, B, A, B...), not all of A's rounds
            # first: the machine's drift over minutes then falls on each alike.
            rounds = {kind: [] for kind in servers}
            for n in range(a.rounds):
                for kind in servers:
                    print(f"  [{i}/{len(workloads)}] {workload[0]}, round {n + 1}/{a.rounds}: "
                          f"{kind}, 1 worker", flush=True)
                    with tempfile.TemporaryDirectory() as tmp:
                        os.chmod(tmp, 0o755)
                        rounds[kind].append(run(kind, a.bin, workload, a.seconds, tmp, certs,
                                                a.syscalls))
            for kind in servers:
                r = median_round(rounds[kind])
                r.update({"server": kind, "workers": 1, "workload": workload[0]})
                print(f"      {kind:<8} {r['rps']:>10,.0f} req/s  CPU "
                      f"{r['cpu_us_per_request'] or 0:.2f} us/req"
                      f" (user {r.get('user_us_per_request') or 0:.2f}){syscalls_text(r)}"
                      f"  errors {r['errors']}", flush=True)
                results.append(r)
    finally:
        shutil.rmtree(certs)
    by = {(r["server"], r["workload"]): r for r in results}
    print("\n  server CPU per request, ratio to nginx / h2o:")
    for name, *_ in WORKLOADS:
        s = by.get(("spindle", name))
        if not s or not s["cpu_us_per_request"]:
            continue
        ratios = []
        for peer in ("nginx", "h2o"):
            q = by.get((peer, name))
            if q and q["cpu_us_per_request"]:
                ratios.append(f"{ratio_text(s, q)} {peer}")
        print(f"    {name:<24} {s['cpu_us_per_request']:7.2f} us/req  " + ", ".join(ratios))
    write_results(a.out, {"seconds": a.seconds, "rounds": a.rounds, "results": results}, indent=2)


if __name__ == "__main__":
    main()
