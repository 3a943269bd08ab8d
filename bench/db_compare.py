#!/usr/bin/env python3
"""TechEmpower's database test types: spindle (examples/tfb, both roads) against a Go peer
written the way TechEmpower's fast Go entries are (fasthttp + pgx, bench/tfb_go), on the same
PostgreSQL, in the same run.

PostgreSQL is started here (tests/tools/postgres.sh: a temporary directory, a Unix socket, as
the postgres user when run as root) with examples/tfb/schema.sql, and stopped at the end. The Go
peer is built from Go modules (GOFLAGS=-mod=mod). Each server gets one worker (GOMAXPROCS=1 for
Go) and the same number of database connections; wrk opens 256 connections. The figure that
counts is the server's own CPU time per request (its processes, /proc/PID/stat): PostgreSQL and
wrk share the machine, and requests/s says more about them than about the server.

    /usr/bin/python3 bench/db_compare.py --bin build/release/bin --out bench/results/db.json
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import cpu_seconds, free_port, median_round, parse_wrk, stop, wait_listening  # noqa: E402
from results_file import write_results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POSTGRES = os.path.join(ROOT, "tests", "tools", "postgres.sh")
SCHEMA = os.path.join(ROOT, "examples", "tfb", "schema.sql")
WORKLOADS = [("db", "/db"), ("queries=20", "/queries?queries=20"), ("fortunes", "/fortunes"),
             ("updates=20", "/updates?queries=20")]
GOAL = 0.8  # spindle's CPU per request at most this times the Go peer's


def build_go_peer(out_dir):
    binary = os.path.join(out_dir, "tfb_go")
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    subprocess.run(["go", "build", "-o", binary, "."], cwd=os.path.join(ROOT, "bench", "tfb_go"),
                   env=env, check=True)
    return binary


def start(kind, binaries, go_binary, conninfo, connections):
    port = free_port()
    if kind == "go":
        argv = [go_binary, "-listen", f"127.0.0.1:{port}", "-db", conninfo, "-connections",
                str(connections), "-threads", "1"]
    else:
        road = "native" if kind == "spindle" else "hooked"
        argv = [os.path.join(binaries, "tfb"), "--listen", f"127.0.0.1:{port}", "--db", conninfo,
                "--threads", "1", "--connections", str(connections), "--road", road]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_listening(port, proc, timeout=30)
    return proc, port


def measure(kind, binaries, go_binary, conninfo, connections, path, seconds, clients):
    proc, port = start(kind, binaries, go_binary, conninfo, connections)
    try:
        url = f"http://127.0.0.1:{port}{path}"
        subprocess.run(["wrk", "-t2", f"-c{clients}", "-d2s", url], capture_output=True, check=True)
        before = cpu_seconds(proc.pid)
        out = subprocess.run(["wrk", "-t2", f"-c{clients}", f"-d{seconds}s", "--latency", url],
                             capture_output=True, text=True, check=True).stdout
        after = cpu_seconds(proc.pid)
        result = parse_wrk(out)
        result["cpu_us_per_request"] = ((after - before) * 1e6 / result["requests"]
                                        if result["requests"] else None)
        return result
    finally:
        stop(proc)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "bin"))
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--connections", type=int, default=4, help="database connections per server")
    a = p.parse_args()
    # Stopped by a signal, still stop what was started (PostgreSQL, the server under load).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    for tool in ["wrk", "go", "psql"]:
        if shutil.which(tool) is None:
            sys.exit(f"db_compare: {tool} is not installed (make bench installs what it needs)")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    print("[db] building the Go peer (fasthttp + pgx)", flush=True)
    go_binary = build_go_peer(os.path.dirname(os.path.abspath(a.out)))
    pg_dir = tempfile.mkdtemp(prefix="spindle-bench-pg-", dir="/tmp")
    os.chmod(pg_dir, 0o755)
    started = subprocess.run([POSTGRES, "start", pg_dir, str(free_port())], capture_output=True,
                             text=True)
    if started.returncode != 0:
        shutil.rmtree(pg_dir, ignore_errors=True)
        sys.exit(f"db_compare: PostgreSQL did not start: {started.stderr.strip()}")
    conninfo = started.stdout.strip().splitlines()[-1]
    results = []
    try:
        subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-f", SCHEMA],
                       check=True, capture_output=True)
        servers = ["spindle", "spindle-hooked", "go"]
        total = len(WORKLOADS) * len(servers) * a.rounds
        done = 0
        for name, path in WORKLOADS:
            for kind in servers:
                rounds = []
                for _ in range(a.rounds):
                    done += 1
                    r = measure(kind, a.bin, go_binary, conninfo, a.connections, path, a.seconds,
                                a.clients)
                    rounds.append(r)
                    print(f"[db {done}/{total}] {name:11} {kind:15} {r['rps']:9,.0f} req/s "
                          f"{(r['cpu_us_per_request'] or 0):7.1f} CPU µs/req  errors {r['errors']}",
                          flush=True)
                best = median_round(rounds)
                results.append({"workload": name, "server": kind, **best})
    finally:
        subprocess.run([POSTGRES, "stop", pg_dir], check=False)
    data = {"seconds": a.seconds, "rounds": a.rounds, "clients": a.clients,
            "connections": a.connections, "results": results}
    write_results(a.out, data, indent=1)
    print()
    for line in section(data, None):
        print(line)


def section(data, chart):
    """The docs/benchmarks.md section for `data` (and its chart, drawn if `chart` is a path)."""
    results = data["results"]
    by = {(r["workload"], r["server"]): r for r in results}
    md = ["## Databases: the TechEmpower test types against Go (fasthttp + pgx)\n"]
    md.append(f"`/usr/bin/python3 bench/db_compare.py --rounds {data['rounds']} --out "
              f"bench/results/db.json` — wrk -c{data['clients']} for {data['seconds']} s per run, "
              f"the median of {data['rounds']} runs by CPU per request; one worker each "
              f"(GOMAXPROCS=1 for Go), {data['connections']} database connections each, one "
              "PostgreSQL 15 on a Unix socket started by the script. **spindle** is "
              "`build/release/bin/tfb` (its own client: pipelined, one Sync per statement); "
              "**spindle-hooked** is the same binary with `--road hooked` (blocking libpq made "
              "cooperative by hook/); **go** is bench/tfb_go (fasthttp + pgx's pool, prepared "
              "statements, one statement after the other, as TechEmpower's fasthttp entry). "
              "CPU µs/req is the server's own CPU per request; ratios are spindle / peer "
              f"(goal ≤ {GOAL}x go).\n")
    md.append("| workload | server | req/s | p99 ms | CPU µs/req | errors | CPU vs go | |")
    md.append("|---|---|---:|---:|---:|---:|---:|---|")
    for name, _ in WORKLOADS:
        go = by.get((name, "go"))
        for server in ["spindle", "spindle-hooked", "go"]:
            r = by.get((name, server))
            if r is None:
                continue
            cpu = r["cpu_us_per_request"] or 0
            ratio = cpu / go["cpu_us_per_request"] if go and go["cpu_us_per_request"] else None
            verdict = ""
            if server == "spindle" and ratio is not None:
                verdict = "met" if ratio <= GOAL else "not met"
            md.append(f"| {name} | {server} | {r['rps']:,.0f} | {(r['p99_ms'] or 0):.2f} | "
                      f"{cpu:.1f} | {r['errors']} | "
                      f"{f'{ratio:.2f}x' if ratio is not None else '—'} | {verdict} |")
    md.append("")
    hooked = [(n, by[(n, "spindle-hooked")]["cpu_us_per_request"] / by[(n, "spindle")]["cpu_us_per_request"])
              for n, _ in WORKLOADS if (n, "spindle") in by and (n, "spindle-hooked") in by]
    if hooked:
        md.append("The hooked road costs " + ", ".join(f"{r:.2f}x ({n})" for n, r in hooked) +
                  " the native road's CPU per request: every row is its own round trip on a "
                  "connection the request holds, where the native client pipelines the rows of "
                  "all requests of a worker on shared connections.\n")
    if chart:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4))
        names = [n for n, _ in WORKLOADS]
        width = 0.27
        for i, (server, color) in enumerate([("spindle", "#4472c4"), ("spindle-hooked", "#8faadc"),
                                             ("go", "#a5a5a5")]):
            values = [(by.get((n, server)) or {}).get("cpu_us_per_request") or 0 for n in names]
            ax.bar([x + (i - 1) * width for x in range(len(names))], values, width, label=server,
                   color=color)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("server CPU µs per request (lower is better)")
        ax.set_title("TechEmpower database tests, 256 connections, one worker")
        ax.legend()
        fig.tight_layout()
        fig.savefig(chart, dpi=110)
        md.append(f"![databases]({os.path.basename(chart)})\n")
    return md


if __name__ == "__main__":
    main()
