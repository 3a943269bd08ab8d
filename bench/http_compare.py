#!/usr/bin/env python3
"""HTTP/1.1 load comparison: spindle against nginx, h2o and a parse-nothing C ceiling.

Every server gets the same work: "Hello, World!" as text/plain at /plaintext (nginx: `return
200`; h2o: a 13-byte file, as it has no fixed-response handler) and a 612-byte static page at
/index.html. wrk drives each workload; for every run the server's CPU time (utime + stime of
the server and its child processes, from /proc/PID/stat) is divided by the requests served:
on 2 cores wrk saturates a core, so requests/s alone hides what the server costs.

With one worker, the server is pinned to CPU 0 and wrk to CPU 1. With two workers, neither is
pinned (they share both cores). Loopback only; every process started here is stopped by PID.
"""
import argparse
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from ports import free_port  # noqa: E402,F401
from results_file import write_results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STATIC = os.path.join(HERE, "http")


def browser_headers():
    """The request fields a browser sends with a page (bench/http/browser-headers.txt: 14
    fields, 702 bytes, a cookie among them), as -H arguments for wrk or h2load: what a server
    does per field shows here, where the tools' own few fields hide it."""
    with open(os.path.join(STATIC, "browser-headers.txt")) as f:
        return [arg for line in f if line.strip() for arg in ("-H", line.strip())]


WORKLOADS = [  # name, path, connections, extra wrk arguments
    ("keep-alive c100", "/plaintext", 100, []),
    ("keep-alive c100 browser", "/plaintext", 100, browser_headers()),
    ("keep-alive c1000", "/plaintext", 1000, []),
    ("keep-alive c10000", "/plaintext", 10000, []),
    ("close c100", "/plaintext", 100, ["-H", "Connection: close"]),
    ("pipelined x16 c100", "/plaintext", 100, ["-s", os.path.join(STATIC, "pipeline.lua")]),
    ("static 612 B c100", "/index.html", 100, []),
]


def bench_config(tmp, port):
    """bench/http/spindle.yaml listening on `port`, its paths absolute, written into `tmp`."""
    config = os.path.join(tmp, "spindle.yaml")
    with open(os.path.join(STATIC, "spindle.yaml")) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace("127.0.0.1:0", f"127.0.0.1:{port}").replace("bench/http", STATIC))
    return config


def wait_listening(port, proc, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def pin(cpu, workers):
    return ["taskset", "-c", str(cpu)] if workers == 1 and (os.cpu_count() or 1) > 1 else []


def start_spindle(binaries, workers, tmp):
    port = free_port()
    config = bench_config(tmp, port)
    proc = subprocess.Popen(pin(0, workers) + [os.path.join(binaries, "spindle"), "serve",
                            "--config", config, "--threads", str(workers)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def start_nginx(binaries, workers, tmp):
    port = free_port()
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off;
master_process on;
worker_processes {workers};
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log crit;
worker_rlimit_nofile 20000;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  server_tokens off;
  keepalive_requests 1000000;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};
  uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  server {{
    listen 127.0.0.1:{port} reuseport backlog=4096;
    location = /plaintext {{ default_type text/plain; return 200 "Hello, World!"; }}
    location / {{ root {STATIC}; sendfile on; tcp_nopush on; }}
  }}
}}
""")
    proc = subprocess.Popen(pin(0, workers) + ["nginx", "-c", conf, "-p", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def start_h2o(binaries, workers, tmp):
    port = free_port()
    with open(os.path.join(tmp, "plaintext"), "w") as f:
        f.write("Hello, World!")
    conf = os.path.join(tmp, "h2o.conf")
    with open(conf, "w") as f:
        f.write(f"""num-threads: {workers}
listen:
  host: 127.0.0.1
  port: {port}
hosts:
  default:
    paths:
      /plaintext:
        file.file: {tmp}/plaintext
        file.mime.addtypes:
          text/plain: .txt
      /:
        file.dir: {STATIC}
""")
    proc = subprocess.Popen(pin(0, workers) + ["h2o", "-c", conf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def start_ceiling(binaries, workers, tmp):
    port = free_port()
    proc = subprocess.Popen(pin(0, 1) + [os.path.join(binaries, "http_ceiling"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


SERVERS = {"spindle": start_spindle, "nginx": start_nginx, "h2o": start_h2o,
           "ceiling": start_ceiling}


def process_tree(pid):
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                ppid = int(stat[stat.rfind(")") + 2:].split()[1])
                if ppid == pid:
                    pids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return pids


def cpu_seconds(pid, user_only=False):
    """CPU seconds of `pid` and its children so far: user + system, or user alone."""
    total = 0
    for p in process_tree(pid):
        try:
            stat = open(f"/proc/{p}/stat").read()
            fields = stat[stat.rfind(")") + 2:].split()
            total += int(fields[11]) + (0 if user_only else int(fields[12]))
        except (OSError, ValueError, IndexError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid):
    """The peak resident memory (VmHWM) of `pid` and its children, in MiB: what a gateway held
    at most, its buffers, stacks and per-request state under the load it had."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            pass
    return total / 1024


class SyscallCount:
    """System calls made by `pid` and its children inside a `with` block, counted by the
    kernel's raw_syscalls:sys_enter tracepoint through `perf stat` (`count` is None where perf
    or the tracepoint is not available: it needs root or perf_event_paranoid -1). Unlike CPU
    time, the count does not move with the machine's load: it says how many trips to the kernel
    a server makes per request, which is most of what its system time is. With `pid` None,
    counts nothing."""

    def __init__(self, pid):
        self.pid, self.proc, self.count = pid, None, None

    def __enter__(self):
        if self.pid is not None and shutil.which("perf"):
            pids = ",".join(map(str, process_tree(self.pid)))
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", pids],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(0.3)  # attached before the load starts
        return self

    def __exit__(self, *exc):
        if self.proc is None:
            return False
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return False
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and "raw_syscalls:sys_enter" in line and fields[0].isdigit():
                self.count = int(fields[0])
        return False

    def per_request(self, requests):
        return self.count / requests if self.count is not None and requests else None


def cpu_us_per_request(cpu_before, cpu_after, requests):
    """Server CPU microseconds per request served (None if none was)."""
    return (cpu_after - cpu_before) * 1e6 / requests if requests else None


def median_round(rounds):
    """The median of repeated runs, by server CPU per request; it keeps every run's CPU per
    request, in the order they ran ("round_cpu_us"), for ratio_text."""
    per_round = [x["cpu_us_per_request"] for x in rounds]
    median = sorted(rounds, key=lambda x: x["cpu_us_per_request"] or 0)[len(rounds) // 2]
    median["round_cpu_us"] = per_round
    return median


def median_interval(values, confidence=0.9):
    """The median of `values` and an interval that holds the true median with at least
    `confidence` whatever the distribution (order statistics: the number of values below the
    median is binomial(n, 1/2)), or None for fewer than 5 values. With a noisy machine the
    rounds' ratios scatter; a goal is met when the whole interval is within it."""
    n = len(values)
    if n < 5:
        return None
    ordered = sorted(values)
    # The widest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 on each side.
    tail, k = 0.0, 0
    while True:
        p_k = math.comb(n, k) / 2 ** n
        if tail + p_k > (1 - confidence) / 2:
            break
        tail += p_k
        k += 1
    k = max(k, 1)
    return statistics.median(ordered), ordered[k - 1], ordered[n - k]


def ratio_text(a, b):
    """`a`'s CPU per request over `b`'s (two median_round results) as text: the ratio of the
    medians and, when both ran the same rounds in turn, the range of the rounds' own ratios
    (how far the machine moved the figure within this run) and, from five rounds, the median
    of those ratios with its 90% interval (median_interval)."""
    text = f"{a['cpu_us_per_request'] / b['cpu_us_per_request']:.2f}x"
    pairs = [x / y for x, y in zip(a.get("round_cpu_us", []), b.get("round_cpu_us", []))
             if x and y]
    if len(pairs) > 1:
        text += f" (rounds {min(pairs):.2f}-{max(pairs):.2f}"
        interval = median_interval(pairs)
        if interval:
            text += f"; paired {interval[0]:.2f}, 90% {interval[1]:.2f}-{interval[2]:.2f}"
        text += ")"
    return text


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def parse_wrk(text):
    def number(pattern, default=0.0):
        m = re.search(pattern, text)
        return float(m.group(1)) if m else default

    def latency(unit_value):
        value, unit = float(unit_value[0]), unit_value[1]
        return value * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    requests = int(number(r"(\d+) requests in"))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", text)
    errors = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
    errors += int(number(r"Non-2xx or 3xx responses: (\d+)"))
    return {
        "requests": requests,
        "rps": number(r"Requests/sec:\s+([\d.]+)"),
        "p99_ms": latency(p99.groups()) if p99 else None,
        "errors": errors,
    }


def run(kind, binaries, workers, workload, seconds, tmp):
    name, path, connections, extra = workload
    proc, port = SERVERS[kind](binaries, workers, tmp)
    try:
        wait_listening(port, proc)
        threads = 1 if workers == 1 else 2
        warm = subprocess.run(["wrk", "-t1", "-c10", "-d1s", f"http://127.0.0.1:{port}{path}"],
                              capture_output=True, text=True)
        before = cpu_seconds(proc.pid)
        args = pin(1, workers) + ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s",
                                  "--latency", "--timeout", "5s"]
        if "-s" in extra:
            args += ["-s", extra[1], f"http://127.0.0.1:{port}", "--", path]
        else:
            args += extra + [f"http://127.0.0.1:{port}{path}"]
        out = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 60)
        after = cpu_seconds(proc.pid)
        result = parse_wrk(out.stdout)
        result["cpu_us_per_request"] = cpu_us_per_request(before, after, result["requests"])
        if warm.returncode != 0 or out.returncode != 0:
            result["errors"] += 1
        return result
    finally:
        stop(proc)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "bin"))
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--servers", default="spindle,nginx,h2o,ceiling")
    p.add_argument("--workloads", default="",
                   help="only these workloads, by name (comma-separated)")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat each run and keep the median CPU per request")
    a = p.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # wrk -c10000 needs the room
    for tool in ("wrk", "nginx", "h2o", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"http_compare: {tool} is not installed (make bench installs it)")
    results = []
    plan = [(w, wl, s) for w in [int(x) for x in a.workers.split(",")] for wl in WORKLOADS
            for s in a.servers.split(",")
            if not (s == "ceiling" and (w != 1 or wl[1] != "/plaintext"))
            and not (wl[2] > 1000 and (w != 1 or s not in ("spindle", "nginx")))
            and (not a.workloads or wl[0] in a.workloads.split(","))]
    # The servers of one workload take turns round by round (A, B, A, B...), not all of A's
    # rounds first: the machine's drift over minutes then falls on each alike.
    groups = {}  # (workers, workload name) -> (workload, servers)
    for workers, workload, kind in plan:
        groups.setdefault((workers, workload[0]), (workload, []))[1].append(kind)
    step = 0
    for (workers, _), (workload, kinds) in groups.items():
        rounds = {kind: [] for kind in kinds}
        for n in range(a.rounds):
            for kind in kinds:
                step += 1
                print(f"  [{step}/{len(plan) * a.rounds}] {kind}, {workers} worker(s), "
                      f"{workload[0]}, round {n + 1}/{a.rounds}", flush=True)
                with tempfile.TemporaryDirectory() as tmp:
                    os.chmod(tmp, 0o755)  # h2o, started as root, reads files as nobody
                    rounds[kind].append(run(kind, a.bin, workers, workload, a.seconds, tmp))
        medians = {}
        for kind in kinds:
            r = median_round(rounds[kind])
            r.update({"server": kind, "workers": workers, "workload": workload[0]})
            cpu = r["cpu_us_per_request"]
            print(f"      {kind:<8} {r['rps']:>10,.0f} req/s  p99 {r['p99_ms'] or 0:.2f} ms  "
                  f"CPU {cpu or 0:.2f} us/req  errors {r['errors']}", flush=True)
            results.append(r)
            medians[kind] = r
        s = medians.get("spindle")
        peers = [k for k in kinds if k != "spindle" and medians[k]["cpu_us_per_request"]]
        if s and s["cpu_us_per_request"] and peers:
            print("      spindle's CPU per request: " +
                  ", ".join(f"{ratio_text(s, medians[k])} {k}" for k in peers), flush=True)
    write_results(a.out, {"seconds": a.seconds, "rounds": a.rounds, "results": results}, indent=2)


if __name__ == "__main__":
    main()
