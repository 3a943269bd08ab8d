#!/usr/bin/env python3
"""Echo throughput: spindle's examples/echo (one worker) against bench/epoll_echo.c.

Both servers run pinned to CPU 0, the load generator (bench/echo_load.cc) to CPU 1, with the
same connections and message size, alternating which server goes first, several rounds. For
every run it records messages/s and the server's CPU time per message (/proc/PID/stat), which
is the fairer figure on 2 cores where the client may be the bottleneck. Loopback only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import free_port, stop  # noqa: E402  (shared process helpers)
from results_file import write_results  # noqa: E402

CASES = [  # (connections, message bytes)
    (100, 64),
    (1000, 64),
    (100, 4096),
]


def taskset(cpu):
    return ["taskset", "-c", str(cpu)] if os.cpu_count() and os.cpu_count() > 1 else []


def start_server(kind, binaries, port):
    if kind == "spindle":
        cmd = [os.path.join(binaries, "echo"), f"127.0.0.1:{port}", "1"]
    else:
        cmd = [os.path.join(binaries, "epoll_echo"), str(port)]
    proc = subprocess.Popen(taskset(0) + cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"{kind} did not start: {line!r}")
    return proc


def run_once(kind, binaries, connections, size, seconds):
    port = free_port()
    server = start_server(kind, binaries, port)
    try:
        load = subprocess.run(
            taskset(1) + [os.path.join(binaries, "echo_load"), f"127.0.0.1:{port}",
                          str(connections), str(size), str(seconds), str(server.pid)],
            capture_output=True, text=True, timeout=seconds + 60)
    finally:
        stop(server)
    if load.returncode != 0:
        raise RuntimeError(f"echo_load against {kind} failed: {load.stdout}{load.stderr}")
    return json.loads(load.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    results = []
    total = len(CASES) * args.rounds * 2
    done = 0
    for connections, size in CASES:
        runs = {"spindle": [], "epoll": []}
        for r in range(args.rounds):
            order = ["spindle", "epoll"] if r % 2 == 0 else ["epoll", "spindle"]
            for kind in order:
                done += 1
                print(f"  [{done}/{total}] {kind}: {connections} connections, {size} B, "
                      f"{args.seconds:.0f} s", flush=True)
                runs[kind].append(run_once(kind, args.bin, connections, size, args.seconds))
        row = {"connections": connections, "bytes": size}
        for kind, samples in runs.items():
            row[kind] = {
                "messages_per_second": statistics.median(s["messages_per_second"] for s in samples),
                "server_cpu_us_per_message": statistics.median(
                    s["server_cpu_us_per_message"] for s in samples),
                "errors": sum(s["errors"] for s in samples),
            }
        row["throughput_ratio"] = (row["spindle"]["messages_per_second"] /
                                   row["epoll"]["messages_per_second"])
        row["cpu_ratio"] = (row["spindle"]["server_cpu_us_per_message"] /
                            row["epoll"]["server_cpu_us_per_message"])
        print(f"  => {connections} conns {size} B: spindle/epoll throughput "
              f"{row['throughput_ratio']:.3f}, server CPU per message {row['cpu_ratio']:.3f}",
              flush=True)
        results.append(row)
    write_results(args.out, {"seconds": args.seconds, "rounds": args.rounds, "cases": results}, indent=2)


if __name__ == "__main__":
    sys.exit(main())
