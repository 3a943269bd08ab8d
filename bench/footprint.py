#!/usr/bin/env python3
"""The cache lines a hello-world request touches, by function and by memory region.

spindle (one worker, bench/http/spindle.yaml) runs under valgrind's lackey, which prints every
instruction and every data access; one keep-alive client sends GET /plaintext one request at a
time. The trace is cut at each `syscall` instruction: the kernel's TCP work between two system
calls evicts much of the first-level caches, so each distinct 64-byte line a request touches
between two calls is what it may have to fetch again. Counted per request, over the stretches
that run the server's code (the main thread's configuration watch is left out):

    bench/footprint.py [--bin build/release/bin] [--requests 200] [--top 25]

A model, not a measurement of time: it counts every line of a stretch as cold (the real caches
keep some), and under lackey each poll finds one request, so per-poll work (the runner fiber's
start and end) is counted once a request where wrk -c100 shares it among ~9. What it is for:
seeing which code and which objects a request touches, and whether a change touches fewer
(docs/performance.md, "Whole-build levers against the ceiling"). Loopback only; the server it
starts it stops, by PID. Takes about a minute.
"""
import argparse
import bisect
import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import ROOT, bench_config, free_port  # noqa: E402  (shared bench helpers)

REQUEST = b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"
# Functions whose stretches are the worker's: its poll loop, the reactor, the HTTP server.
WORKER_CODE = re.compile(r"spindle::(Worker::|Reactor|TcpStream|http::)")


def send_requests(conn, count):
    for _ in range(count):
        conn.sendall(REQUEST)
        got = b""
        while not got.endswith(b"Hello, World!"):
            piece = conn.recv(4096)
            if not piece:
                sys.exit("footprint.py: the server closed the connection")
            got += piece


class Memory:
    """The server's mappings, symbols and system-call instructions, by address."""

    def __init__(self, maps_text):
        self.regions = []
        for line in maps_text.splitlines():
            p = line.split()
            lo, hi = (int(x, 16) for x in p[0].split("-"))
            self.regions.append((lo, hi, p[5] if len(p) > 5 else "", int(p[2], 16), p[1]))
        self.regions.sort()
        self.starts = [r[0] for r in self.regions]
        self.symbols, self.syscalls = [], set()
        for path in sorted({r[2] for r in self.regions if "x" in r[4] and r[2].startswith("/")}):
            base = min((r[0] for r in self.regions if r[2] == path and r[3] == 0), default=None)
            if base is None:
                continue
            dynamic = [] if os.path.basename(path) == "spindle" else ["-D"]
            nm = subprocess.run(["nm", "-C", "--defined-only"] + dynamic + [path],
                                capture_output=True, text=True).stdout
            for line in nm.splitlines():
                p = line.split(" ", 2)
                if len(p) == 3 and p[1] in "tTwWi":
                    self.symbols.append((base + int(p[0], 16), p[2], os.path.basename(path)))
            dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path],
                                 capture_output=True, text=True).stdout
            # Each `syscall` instruction but the clock's: valgrind has no vDSO, so a clock read
            # is a system call here where the real run reads the clock in user space.
            function = ""
            for line in dis.splitlines():
                if line.endswith(">:"):
                    function = line
                    continue
                m = re.match(r"^\s*([0-9a-f]+):\s+syscall\b", line)
                if m and not re.search(r"<(__)?clock_get|<gettimeofday|<time@",
                                       function):
                    self.syscalls.add(base + int(m.group(1), 16))
        self.symbols.sort()
        self.symbol_starts = [s[0] for s in self.symbols]

    def function(self, address):
        i = bisect.bisect_right(self.symbol_starts, address) - 1
        if i < 0:
            return "?"
        name, obj = self.symbols[i][1], self.symbols[i][2]
        if name == "_init":  # the PLT's stubs follow .init and have no symbols of their own
            return f"PLT stubs: calls into shared libraries [{obj}]"
        return f"{name[:100]} [{obj}]"

    def region(self, address):
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0 or address >= self.regions[i][1]:
            return "?"
        lo, hi, path, _, perms = self.regions[i]
        if path:
            return f"{os.path.basename(path)} {perms}"
        return f"anonymous {perms} {lo:x} ({(hi - lo) >> 10} KiB)"


def count(trace, memory, requests, top):
    code_total = data_total = stretches = 0
    code_by_function = collections.Counter()
    data_by_function = collections.Counter()
    data_by_region = collections.Counter()
    function_of_line = {}
    worker_line = {}
    code, data = set(), {}
    last = 0
    worker = False

    def end_stretch():
        nonlocal code_total, data_total, stretches
        if worker:
            stretches += 1
            code_total += len(code)
            data_total += len(data)
            for line in code:
                code_by_function[function_of_line[line]] += 1
            for line, at in data.items():
                data_by_function[memory.function(at)] += 1
                data_by_region[memory.region(line << 6)] += 1
        code.clear()
        data.clear()

    for line in trace:
        if len(line) < 4:
            continue
        if line[0] == "I":
            last = int(line[3:line.index(",")], 16)
            cache_line = last >> 6
            if cache_line not in code:
                code.add(cache_line)
                if cache_line not in function_of_line:
                    name = memory.function(cache_line << 6)
                    function_of_line[cache_line] = name
                    worker_line[cache_line] = bool(WORKER_CODE.search(name))
                worker = worker or worker_line[cache_line]
            if last in memory.syscalls:
                end_stretch()
                worker = False
        elif line[1] in "LSM":
            cache_line = int(line[3:line.index(",")], 16) >> 6
            if cache_line not in data:
                data[cache_line] = last
    print(f"{requests} requests, {stretches / requests:.1f} stretches between system calls each")
    print(f"code lines a request: {code_total / requests:.0f}; data lines: "
          f"{data_total / requests:.0f}")
    print("data lines by memory region:")
    for name, n in data_by_region.most_common(top):
        print(f"  {n / requests:7.1f}  {name}")
    print("data lines by the function that touched them first in a stretch:")
    for name, n in data_by_function.most_common(top):
        print(f"  {n / requests:7.1f}  {name}")
    print("code lines by function:")
    for name, n in code_by_function.most_common(top):
        print(f"  {n / requests:7.1f}  {name}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "bin"))
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    for tool in ("valgrind", "nm", "objdump"):
        if shutil.which(tool) is None:
            sys.exit(f"footprint.py: {tool} is not installed")
    tmp = tempfile.mkdtemp(prefix="footprint-")
    port = free_port()
    config = bench_config(tmp, port)
    trace_path = os.path.join(tmp, "trace")
    server = subprocess.Popen(
        ["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={trace_path}",
         os.path.join(args.bin, "spindle"), "serve", "--config", config, "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        print(f"footprint: spindle under lackey on port {port}, waiting for it to listen",
              flush=True)
        deadline = time.monotonic() + 180
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=60)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit("footprint.py: spindle did not start under lackey")
                time.sleep(1)
        print(f"footprint: {args.warmup} requests to warm up, then {args.requests} traced",
              flush=True)
        send_requests(conn, args.warmup)
        time.sleep(1)
        start = os.path.getsize(trace_path)
        send_requests(conn, args.requests)
        time.sleep(1)
        end = os.path.getsize(trace_path)
        with open(f"/proc/{server.pid}/maps") as f:
            maps_text = f.read()
        conn.close()
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    print(f"footprint: {(end - start) >> 20} MiB of trace; symbols and system calls", flush=True)
    memory = Memory(maps_text)
    with open(trace_path, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode("ascii", "replace")
    shutil.rmtree(tmp)
    # The slice may begin and end inside a line (a timer's work is traced meanwhile): the
    # first and last lines are dropped.
    count(text.splitlines()[1:-1], memory, args.requests, args.top)


if __name__ == "__main__":
    main()
