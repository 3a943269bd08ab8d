#!/usr/bin/env python3
"""Soak through the proxy: wrk holds --connections client connections (10,000 by default) to
spindle for --seconds, every request going through a route with a typical middleware chain
(request id, a header edit, a local rate limit far above the load, the access log) to an
upstream (nginx, one worker). With --protocol h2 the whole way is HTTP/2 over TLS: h2load's
clients to spindle, spindle to nginx (spindle's own HTTP/2 code on both sides). Every second
it samples spindle's resident memory and open descriptors and prints them. Passes (exit 0)
when the client (wrk or h2load) saw no socket error and no non-2xx answer, RSS after the
warm-up (the first quarter) stayed within --rss-growth of the highest it reached during the
warm-up (under full load RSS moves by ±5% from one second to the next: one sample is no
level to measure a leak from), and the descriptors
came back to their idle count once the client was done. Writes the samples to --out (JSON),
draws them (--chart), and with --markdown replaces the page's `make soak` section for the
protocol (bench/doc_sections.py). Loopback only; stops what it started, by PID.
"""
import argparse
import datetime
import json
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from doc_sections import chart_link, write_section  # noqa: E402
from ports import free_port  # noqa: E402,F401
from results_file import write_results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))


def descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def listening(proc):
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{proc.args[0]} exited before listening")
    return json.loads(line)["address"]


def wait_listening(port, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def chart(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [s["t"] for s in result["samples"]]
    fig, rss = plt.subplots(figsize=(8, 3.5))
    rss.plot(t, [s["rss_kib"] / 1024 for s in result["samples"]], color="tab:blue")
    rss.set_xlabel("seconds")
    rss.set_ylabel("spindle RSS (MiB)", color="tab:blue")
    rss.set_ylim(bottom=0)
    fds = rss.twinx()
    fds.plot(t, [s["fds"] for s in result["samples"]], color="tab:orange")
    fds.set_ylabel("open descriptors", color="tab:orange")
    fds.set_ylim(bottom=0)
    way = "HTTP/2 over TLS" if result.get("protocol") == "h2" else "HTTP/1.1"
    plt.title(f"Soak through the proxy ({way}): {result['connections']:,} connections, "
              f"{result['requests']:,} requests, {result['socket_errors']} errors")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def section(result, chart, markdown, command):
    """The page's `make soak` section for `result`'s protocol: when and how, the figures the
    verdict rests on, and the chart."""
    h2 = result.get("protocol") == "h2"
    way = ("HTTP/2 over TLS both ways (h2load, "
           f"{result['streams']} requests in flight a connection)" if h2 else "HTTP/1.1 (wrk)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    mib = 1024
    loaded = max((s["fds"] for s in result["samples"]), default=0)
    md = [f"## Soak through the proxy: {way}\n",
          f"- Run: {datetime.date.today().isoformat()}, commit `{commit}`; command: `{command}`",
          f"- {result['connections']:,} client connections for {result['seconds']} s to spindle "
          "(2 workers) through a route with a typical chain (a header edit each way, a local "
          "rate limit far above the load, the access log to a file) to nginx (one worker); the "
          "client, spindle and nginx share the machine. Passes with no error, no non-2xx answer, "
          "RSS after the warm-up (the first quarter) within 10% of the warm-up's highest, and "
          "the descriptors back once the clients are gone.\n",
          "| requests | errors | non-2xx | RSS, warm-up's highest | peak after | a connection "
          "at the peak | descriptors idle / loaded / after |",
          "|---:|---:|---:|---:|---:|---:|---|",
          f"| {result['requests']:,} ({result['requests'] / result['seconds']:,.0f}/s) | "
          f"{result['socket_errors']} | {result['non2xx']} | "
          f"{result['rss_warmup_peak_kib'] / mib:,.0f} MiB | "
          f"{result['rss_peak_kib'] / mib:,.0f} MiB ({result['rss_growth']:+.1%}) | "
          f"{result['rss_peak_kib'] / result['connections']:,.0f} KiB | "
          f"{result['idle_fds']:,} / {loaded:,} / {result['fds_after']:,} |\n"]
    if chart:
        md.append(chart_link("RSS and descriptors over the soak", chart, markdown) + "\n")
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=180)
    ap.add_argument("--threads", type=int, default=2, help="spindle's workers")
    ap.add_argument("--rss-growth", type=float, default=0.10,
                    help="largest RSS growth after the warm-up, as a share")
    ap.add_argument("--out", help="where to write the samples (JSON)")
    ap.add_argument("--chart", help="where to draw RSS and descriptors over time (PNG)")
    ap.add_argument("--protocol", choices=("h1", "h2"), default="h1",
                    help="h1: HTTP/1.1 both ways (wrk); h2: HTTP/2 over TLS both ways (h2load)")
    ap.add_argument("--streams", type=int, default=1,
                    help="with --protocol h2: requests in flight on each client connection")
    ap.add_argument("--markdown", help="the page whose `make soak` section for this protocol "
                                       "to write (replaced)")
    args = ap.parse_args()
    h2 = args.protocol == "h2"
    client = "h2load" if h2 else "wrk"
    if shutil.which(client) is None:
        print(f"soak: {client} is not installed (scripts/install-deps.sh test installs it)")
        return 2

    need = args.connections + 1_000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < need:
        print(f"soak: needs `ulimit -n` of at least {need} for {args.connections} connections; "
              f"the hard limit here is {hard}: raise it (or pass fewer --connections)")
        return 2
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    tmp = tempfile.mkdtemp(prefix="spindle-soak-")
    certs = os.path.join(tmp, "certs")
    if h2:
        subprocess.run([os.path.join(ROOT, "tests", "tls", "make-certs.sh"), certs], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # The upstream: nginx (one worker) answering "Hello, World!"; its logs and spindle's go to
    # files (a pipe nobody reads would stall them once full).
    upstream_port = free_port()
    upstream_tls = (f" ssl http2;\n    ssl_certificate {certs}/localhost.pem; "
                    f"ssl_certificate_key {certs}/localhost.key;" if h2 else ";")
    with open(os.path.join(tmp, "upstream.conf"), "w") as f:
        f.write(f"""daemon off; master_process on; worker_processes 1;
pid {tmp}/upstream.pid; error_log {tmp}/upstream-error.log crit; worker_rlimit_nofile 20000;
events {{ worker_connections 16384; }}
http {{
  access_log off; keepalive_requests 1000000; http2_max_requests 1000000;
  keepalive_timeout 300s;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};
  uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  server {{
    listen 127.0.0.1:{upstream_port}{upstream_tls}
    location = /plaintext {{ default_type text/plain; return 200 "Hello, World!"; }}
  }}
}}
""")
    upstream = subprocess.Popen(["nginx", "-c", os.path.join(tmp, "upstream.conf"), "-p", tmp],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spindle = None
    ok = False
    try:
        target = f"{'localhost' if h2 else '127.0.0.1'}:{upstream_port}"
        wait_listening(upstream_port)
        config = os.path.join(tmp, "soak.yaml")
        server_tls = (f"\n    http2: true\n    tls: {{cert: {certs}/localhost.pem, "
                      f"key: {certs}/localhost.key}}" if h2 else "")
        service_tls = f", protocol: h2, tls: {{ca: {certs}/ca.pem}}" if h2 else ""
        with open(config, "w") as f:
            f.write(f"""
servers:
  - listen: 127.0.0.1:0
    access_log: {{path: {tmp}/access.log, format: combined}}
    timeouts: {{keepalive: 300s}}{server_tls}
routes:
  - name: soak
    match: {{path_prefix: /}}
    middlewares:
      - headers: {{request: {{set: {{x-soak: "1"}}}}, response: {{remove: [x-powered-by]}}}}
      - rate_limit: {{key: client_ip, rate: 10000000/s, burst: 10000000}}
    service: up
services:
  up: {{upstream: up, timeouts: {{connect: 30s, first_byte: 30s}}{service_tls}}}
upstreams:
  up:
    targets: [{{address: "{target}"}}]
    keepalive: {{max_idle: 1024}}
    limits: {{max_connections: 1024}}
""")
        spindle = subprocess.Popen([os.path.join(args.build, "bin", "spindle"), "serve",
                                    "--config", config, "--threads", str(args.threads)],
                                   stdout=subprocess.PIPE,
                                   stderr=open(os.path.join(tmp, "spindle.log"), "w"), text=True)
        address = listening(spindle)
        idle_fds = descriptors(spindle.pid)
        print(f"soak: spindle {spindle.pid} at {address}, {args.connections} connections for "
              f"{args.seconds}s; idle: {rss_kib(spindle.pid)} KiB, {idle_fds} descriptors",
              flush=True)
        if h2:
            port = address.rsplit(":", 1)[1]
            command = ["h2load", "-t2", f"-c{args.connections}", f"-m{args.streams}",
                       f"-D{args.seconds}", f"https://localhost:{port}/plaintext"]
        else:
            command = ["wrk", "-t2", f"-c{args.connections}", f"-d{args.seconds}s",
                       "--timeout", "10s", f"http://{address}/plaintext"]
        load = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        samples = []
        start = time.monotonic()
        while load.poll() is None:
            time.sleep(1)
            t = time.monotonic() - start
            try:
                sample = {"t": round(t, 1), "rss_kib": rss_kib(spindle.pid),
                          "fds": descriptors(spindle.pid)}
            except (FileNotFoundError, ProcessLookupError):
                break
            samples.append(sample)
            print(f"soak: {t:5.0f}s  rss {sample['rss_kib'] / 1024:7.1f} MiB  "
                  f"descriptors {sample['fds']}", flush=True)
        out = load.communicate()[0]
        print(out, flush=True)
        if h2:
            # requests: N total, N started, N done, N succeeded, N failed, N errored, N timeout
            counts = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) "
                               r"succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", out)
            codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
            done = int(counts.group(4)) if counts else 0
            errors = sum(int(counts.group(i)) for i in (5, 6, 7)) if counts else 1
            non2xx = sum(int(codes.group(i)) for i in (2, 3, 4)) if codes else 1
        else:
            done = int(re.search(r"(\d+) requests in", out).group(1))
            errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
            non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
            non2xx = int(non2xx.group(1)) if non2xx else 0
        # Descriptors back to idle once the clients are gone (the upstream pool may keep a few).
        settled = None
        for _ in range(50):
            settled = descriptors(spindle.pid)
            if settled <= idle_fds + 2 * 1024 + 8:
                break
            time.sleep(0.2)
        warm_up, after = samples[:len(samples) // 4], samples[len(samples) // 4:]
        base = max(s["rss_kib"] for s in warm_up) if warm_up else (
            after[0]["rss_kib"] if after else 0)
        peak = max(s["rss_kib"] for s in after) if after else 0
        growth = (peak - base) / base if base else 0.0
        result = {"protocol": args.protocol, "connections": args.connections,
                  "streams": args.streams if h2 else 1, "seconds": args.seconds,
                  "requests": done, "socket_errors": errors, "non2xx": non2xx,
                  "rss_warmup_peak_kib": base, "rss_peak_kib": peak, "rss_growth": growth,
                  "idle_fds": idle_fds, "fds_after": settled, "samples": samples}
        if args.out:
            write_results(args.out, result, indent=1)
        if args.chart:
            chart(result, args.chart)
        if args.markdown:
            name = "make soak, HTTP/2" if h2 else "make soak, HTTP/1.1"
            command = shlex.join(["bench/soak_proxy.py"] + sys.argv[1:])
            write_section(args.markdown, name, "bench/soak_proxy.py",
                          section(result, args.chart, args.markdown, command))
        print(f"soak: {done} requests, {errors} socket errors, {non2xx} non-2xx; RSS "
              f"{base / 1024:.1f} MiB at most in the warm-up, peak {peak / 1024:.1f} MiB after "
              f"({growth:+.1%}); descriptors {idle_fds} idle, {settled} after", flush=True)
        ok = (errors == 0 and non2xx == 0 and done > 0 and growth <= args.rss_growth and
              settled <= idle_fds + 2 * 1024 + 8)
        code = stop(spindle)
        if code != 0:
            print(f"soak: spindle exited {code}")
            ok = False
        print("soak: PASS" if ok else "soak: FAIL", flush=True)
        return 0 if ok else 1
    finally:
        if spindle is not None:
            stop(spindle)
        stop(upstream)
        # The access log alone grows by ~10 MB a second: kept only when there is something to
        # read in it.
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"soak: logs and configuration kept in {tmp}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
