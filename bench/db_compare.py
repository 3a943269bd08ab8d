#!/usr/bin/env python3
"""TechEmpower's database test types: spindle (examples/tfb, both roads) against a Go peer
written the way TechEmpower's fast Go entries are (fasthttp + pgx, bench/tfb_go), on the same
PostgreSQL, in the same run.

PostgreSQL is started here (tests/tools/postgres.sh: a temporary directory, a Unix socket, as
the postgres user when run as root) with examples/tfb/schema.sql, and stopped at the end. The Go
peer is built from Go modules (GOFLAGS=-mod=mod). Each server gets one worker (GOMAXPROCS=1 for
Go) and the same number of database connections; wrk opens 256 connections. The figure that
counts is the server's own CPU time per request (its processes, /proc/PID/stat): PostgreSQL and
wrk share the machine, and requests/s says more about them than about the server. PostgreSQL's
CPU per request (its postmaster and every backend, those that ended included) is measured beside
it: how hard each server makes the database work.

    /usr/bin/python3 bench/db_compare.py --bin build/release/bin --out bench/results/db.json

The pool's section (`--pool-section docs/benchmarks.md`): /db and /fortunes at 64 and 256
clients, the default options against `--connections 1`, the Go peer and, with `--baseline`,
another build's tfb (the pool before a change), each figure a ratio to the Go peer of its run.
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
from doc_sections import write_section  # noqa: E402

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


def postgres_cpu_seconds(postmaster):
    """CPU seconds of PostgreSQL so far: its backends that run, and all that ended (the
    postmaster's children's times once it reaped them)."""
    total = cpu_seconds(postmaster)
    try:
        stat = open(f"/proc/{postmaster}/stat").read()
        fields = stat[stat.rfind(")") + 2:].split()
        total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return total


def start(kind, binaries, go_binary, conninfo, connections):
    port = free_port()
    if kind == "spindle-1conn":
        kind, connections = "spindle", 1
    if kind == "spindle-baseline":
        argv = [binaries, "--listen", f"127.0.0.1:{port}", "--db", conninfo, "--threads", "1",
                "--connections", str(connections)]
    elif kind == "go":
        argv = [go_binary, "-listen", f"127.0.0.1:{port}", "-db", conninfo, "-connections",
                str(connections), "-threads", "1"]
    else:
        road = "native" if kind == "spindle" else "hooked"
        argv = [os.path.join(binaries, "tfb"), "--listen", f"127.0.0.1:{port}", "--db", conninfo,
                "--threads", "1", "--connections", str(connections), "--road", road]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_listening(port, proc, timeout=30)
    return proc, port


def measure(kind, binaries, go_binary, conninfo, connections, path, seconds, clients,
            postmaster=None):
    proc, port = start(kind, binaries, go_binary, conninfo, connections)
    try:
        url = f"http://127.0.0.1:{port}{path}"
        subprocess.run(["wrk", "-t2", f"-c{clients}", "-d2s", url], capture_output=True, check=True)
        before = cpu_seconds(proc.pid)
        pg_before = postgres_cpu_seconds(postmaster) if postmaster else 0
        out = subprocess.run(["wrk", "-t2", f"-c{clients}", f"-d{seconds}s", "--latency", url],
                             capture_output=True, text=True, check=True).stdout
        after = cpu_seconds(proc.pid)
        pg_after = postgres_cpu_seconds(postmaster) if postmaster else 0
        result = parse_wrk(out)
        n = result["requests"]
        result["cpu_us_per_request"] = (after - before) * 1e6 / n if n else None
        result["pg_cpu_us_per_request"] = ((pg_after - pg_before) * 1e6 / n
                                           if n and postmaster else None)
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
    p.add_argument("--pool-section", metavar="PAGE",
                   help="measure the pool's policy instead, and write its section of PAGE")
    p.add_argument("--baseline", metavar="TFB",
                   help="with --pool-section: another build's tfb binary, measured beside")
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
        if a.pool_section:
            with open(os.path.join(pg_dir, "data", "postmaster.pid")) as f:
                postmaster = int(f.readline())
            data = pool_run(a, go_binary, conninfo, postmaster)
            write_results(a.out, data, indent=1)
            lines = pool_section(data)
            write_section(a.pool_section, "db pool", "bench/db_compare.py --pool-section", lines)
            print("\n".join(lines))
            return
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


POOL_WORKLOADS = [("db", "/db"), ("fortunes", "/fortunes")]
POOL_CLIENTS = [64, 256]
PG_GOAL = 0.55  # PostgreSQL's CPU per request for spindle at most this times for the Go peer


def pool_run(a, go_binary, conninfo, postmaster):
    """Every server of the pool's comparison, round after round in turn (so that the machine's
    noise falls on all alike); per server the median of each figure over the rounds."""
    servers = ["spindle", "spindle-1conn", "go"] + (["spindle-baseline"] if a.baseline else [])
    results = []
    for clients in POOL_CLIENTS:
        for name, path in POOL_WORKLOADS:
            runs = {kind: [] for kind in servers}
            for round_ in range(a.rounds):
                for kind in servers:
                    binaries = a.baseline if kind == "spindle-baseline" else a.bin
                    r = measure(kind, binaries, go_binary, conninfo, a.connections, path,
                                a.seconds, clients, postmaster)
                    runs[kind].append(r)
                    print(f"[pool -c{clients} {name} {round_ + 1}/{a.rounds}] {kind:16} "
                          f"{r['rps']:9,.0f} req/s  p99 {(r['p99_ms'] or 0):6.2f} ms  "
                          f"{(r['cpu_us_per_request'] or 0):6.1f} CPU µs/req  PostgreSQL "
                          f"{(r['pg_cpu_us_per_request'] or 0):6.1f} µs/req  errors {r['errors']}",
                          flush=True)
            for kind, rounds in runs.items():
                row = {"workload": name, "clients": clients, "server": kind, "errors": 0}
                for key in ["rps", "p99_ms", "cpu_us_per_request", "pg_cpu_us_per_request"]:
                    values = sorted(r[key] or 0 for r in rounds)
                    row[key] = values[len(values) // 2]
                    row["round_" + key] = [r[key] for r in rounds]
                row["errors"] = sum(r["errors"] for r in rounds)
                results.append(row)
    return {"seconds": a.seconds, "rounds": a.rounds, "connections": a.connections,
            "baseline": a.baseline, "results": results}


def pool_section(data):
    """The docs/benchmarks.md section of the pool's policy (issue 69 item 17's goal)."""
    by = {(r["workload"], r["clients"], r["server"]): r for r in data["results"]}
    md = ["### Databases: the pool's connections and PostgreSQL's work\n",
          f"`/usr/bin/python3 bench/db_compare.py --rounds {data['rounds']} --seconds "
          f"{data['seconds']} --pool-section docs/benchmarks.md --out bench/results/db_pool.json"
          + (" --baseline BASELINE_TFB" if data.get("baseline") else "") + "` — one worker "
          f"each, {data['connections']} database connections each (the script's default) but "
          "**spindle-1conn** (`tfb --connections 1`); **spindle-baseline** is the tfb of "
          "another build (the pool before the change), **go** bench/tfb_go (pgx's pool). The "
          "median of the rounds of each figure, the servers taking turns in each round. "
          "PostgreSQL µs/req is the CPU of the postmaster and all its backends per request; "
          f"goal: spindle's at most {PG_GOAL}x go's, its own CPU at most spindle-1conn's, its "
          "p99 at most spindle-baseline's.\n",
          "| clients | workload | server | req/s | p99 ms | CPU µs/req | PostgreSQL µs/req | "
          "PostgreSQL vs go | errors |",
          "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for clients in POOL_CLIENTS:
        for name, _ in POOL_WORKLOADS:
            go = by.get((name, clients, "go"))
            for server in ["spindle", "spindle-1conn", "spindle-baseline", "go"]:
                r = by.get((name, clients, server))
                if r is None:
                    continue
                pg = r["pg_cpu_us_per_request"] or 0
                ratio = pg / go["pg_cpu_us_per_request"] if go and go["pg_cpu_us_per_request"] \
                    else None
                md.append(f"| {clients} | {name} | {server} | {r['rps']:,.0f} | "
                          f"{(r['p99_ms'] or 0):.2f} | {(r['cpu_us_per_request'] or 0):.1f} | "
                          f"{pg:.1f} | {f'{ratio:.2f}x' if ratio is not None else '—'} | "
                          f"{r['errors']} |")
    md.append("")
    return md


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
