#!/usr/bin/env python3
"""Reverse-proxy comparison: spindle against nginx, haproxy and h2o as gateways, one worker
each, in the four set-ups of the Bifrost report, in front of one upstream shared by all:

  h1->h1          wrk over HTTP/1.1 to the gateway, HTTP/1.1 to the upstream
  https->h1       wrk over HTTPS/1.1, HTTP/1.1 to the upstream
  h2tls->h1       h2load over HTTP/2 (TLS, ALPN h2), HTTP/1.1 to the upstream
  h2tls->h2       h2load over HTTP/2 (TLS), HTTP/2 over TLS to the upstream

at 100 and 500 client connections. The upstream is nginx (one worker) answering GET
/plaintext with "Hello, World!" on a cleartext HTTP/1.1 port and an HTTP/2 TLS port. The
gateway is pinned to CPU 0; the upstream and the load generator share CPU 1. For each run
the gateway's CPU time (utime + stime, with its children) is divided by the requests served,
and printed with the ratios to the peers, with the gateway's peak resident memory (VmHWM,
with its children) over the run, and the upstream's CPU per request (what each gateway's
traffic costs the server behind it), and the TCP segments a request (every segment on
loopback over the run: client, gateway, upstream and their acknowledgements; how small writes
were packed decides much of what the upstream and the gateway pay in the kernel). nginx
cannot proxy to HTTP/2 upstreams and h2o 2.2
does not either: those cells say n/a.

Two things decide the figures besides each gateway's own code, and two options show them:
- The load is closed (each connection sends its next request when an answer comes), so each
  gateway runs at its own rate; and the upstream and the load generator share CPU 1, so what a
  gateway's traffic costs them sets that rate. A gateway that waits on CPU 1 sleeps between
  turns of its loop, and each sleep and wake-up costs it (and its peers) CPU time a saturated
  one does not pay. `--rps N` gives every gateway the same rate instead (h2load's --rps: N
  requests a second from each connection; the HTTP/2 set-ups only, wrk has no fixed rate).
- spindle adds six fields to every proxied request (X-Forwarded-For, -Proto and -Host, Via,
  X-Request-Id, traceparent); haproxy adds none unless told. `haproxy+fields` is haproxy told
  to add the same six, of the same lengths (random ids included), as its documentation shows.
Loopback only; every process started here is stopped by PID.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_compare import (ROOT, cpu_seconds, cpu_us_per_request, free_port,  # noqa: E402
                          median_round, peak_rss_mb, pin,
                          ratio_text, stop, wait_listening)
from tls_compare import SYSCALL_SECONDS, count_syscalls, measure, syscalls_text  # noqa: E402
from results_file import write_results  # noqa: E402

SETUPS = [  # name, client tool, client scheme, upstream protocol
    ("h1->h1", "wrk", "http", "h1"),
    ("https->h1", "wrk", "https", "h1"),
    ("h2tls->h1", "h2load", "https", "h1"),
    ("h2tls->h2", "h2load", "https", "h2"),
]
CONNECTIONS = [100, 500]


def start_upstream(tmp, certs):
    h1, h2 = free_port(), free_port()
    conf = os.path.join(tmp, "upstream.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; master_process on; worker_processes 1;
pid {tmp}/upstream.pid; error_log {tmp}/upstream-error.log crit; worker_rlimit_nofile 20000;
events {{ worker_connections 16384; }}
http {{
  access_log off; server_tokens off; keepalive_requests 1000000; http2_max_requests 1000000;
  keepalive_timeout 300s;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};
  uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  ssl_certificate {certs}/localhost.pem; ssl_certificate_key {certs}/localhost.key;
  server {{
    listen 127.0.0.1:{h1} reuseport;
    listen 127.0.0.1:{h2} ssl http2 reuseport;
    location = /plaintext {{ default_type text/plain; return 200 "Hello, World!"; }}
  }}
}}
""")
    proc = subprocess.Popen(pin(1, 1) + ["nginx", "-c", conf, "-p", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(h1, proc)
    wait_listening(h2, proc)
    return proc, h1, h2


def start_spindle(binaries, tmp, certs, up_h1, up_h2, upstream_protocol, chain=False,
                  log_only=False, max_connections=None, huge_page_stacks=False):
    plain, tls = free_port(), free_port()
    # With `chain`, the route has what a gateway typically runs on every request: a header
    # edit each way, a local rate limit (far above the load) and the access log, to a file.
    # (A request id and traceparent are made for every proxied request anyway.)
    # (log_only: the access log alone, to see its share.)
    log = f"{{path: {tmp}/access.log, format: combined}}" if chain or log_only else "off"
    middlewares = ("""
    middlewares:
      - headers: {request: {set: {x-env: bench}}, response: {remove: [x-powered-by]}}
      - rate_limit: {key: client_ip, rate: 100000000/s, burst: 100000000}""" if chain else "")
    service = (f"{{url: \"http://127.0.0.1:{up_h1}\"}}" if upstream_protocol == "h1" else
               f"{{url: \"https://localhost:{up_h2}\", protocol: h2, tls: {{ca: {certs}/ca.pem}}}}")
    upstreams = ""
    if max_connections is not None and upstream_protocol == "h1":
        # An upstreams block: a service given by url has the default limits.
        service = "{upstream: up}"
        upstreams = f"""upstreams:
  up: {{targets: [{{address: 127.0.0.1:{up_h1}}}], limits: {{max_connections: {max_connections}}}}}
"""
    config = os.path.join(tmp, "spindle.yaml")
    with open(config, "w") as f:
        f.write(("huge_page_stacks: true\n" if huge_page_stacks else "") + f"""servers:
  - listen: 127.0.0.1:{plain}
    default_site: false
    compression: false
    access_log: {log}
  - listen: 127.0.0.1:{tls}
    default_site: false
    compression: false
    access_log: {log}
    http2: true
    tls: {{cert: {certs}/localhost.pem, key: {certs}/localhost.key}}
routes:
  - name: all
    match: {{path_prefix: /}}{middlewares}
    service: up
services:
  up: {service}
{upstreams}""")
    proc = subprocess.Popen(pin(0, 1) + [os.path.join(binaries, "spindle"), "serve", "--config",
                                         config, "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, plain, tls


def start_nginx(binaries, tmp, certs, up_h1, up_h2, upstream_protocol):
    if upstream_protocol != "h1":
        return None, 0, 0
    plain, tls = free_port(), free_port()
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; master_process on; worker_processes 1;
pid {tmp}/nginx.pid; error_log {tmp}/nginx-error.log crit; worker_rlimit_nofile 20000;
events {{ worker_connections 16384; }}
http {{
  access_log off; server_tokens off; keepalive_requests 1000000; http2_max_requests 1000000;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};
  uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  ssl_certificate {certs}/localhost.pem; ssl_certificate_key {certs}/localhost.key;
  ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:10m;
  upstream up {{ server 127.0.0.1:{up_h1}; keepalive 1024; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{plain} reuseport;
    listen 127.0.0.1:{tls} ssl http2 reuseport;
    location / {{
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering on;
    }}
  }}
}}
""")
    proc = subprocess.Popen(pin(0, 1) + ["nginx", "-c", conf, "-p", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, plain, tls


# What spindle adds to every proxied request, told to haproxy: X-Forwarded-For, -Proto and -Host,
# Via, a request id of 32 hex digits and a W3C traceparent with a new trace and span id.
HAPROXY_FIELDS = """  option forwardfor
  unique-id-format %[rand,hex]%[rand,hex]
  unique-id-header X-Request-Id
  http-request set-header X-Forwarded-Proto https if { ssl_fc }
  http-request set-header X-Forwarded-Proto http unless { ssl_fc }
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-request set-header Via "2.0 haproxy"
  http-request set-header traceparent 00-%[rand,hex]%[rand,hex]-%[rand,hex]-00
"""


def start_haproxy(binaries, tmp, certs, up_h1, up_h2, upstream_protocol, fields=False):
    plain, tls = free_port(), free_port()
    pem = os.path.join(tmp, "haproxy.pem")
    with open(pem, "w") as out:
        for part in ("localhost.pem", "localhost.key"):
            with open(os.path.join(certs, part)) as f:
                out.write(f.read())
    server = (f"server s1 127.0.0.1:{up_h1}" if upstream_protocol == "h1" else
              f"server s1 127.0.0.1:{up_h2} ssl verify none alpn h2")
    conf = os.path.join(tmp, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(f"""global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend plain
  bind 127.0.0.1:{plain}
  bind 127.0.0.1:{tls} ssl crt {pem} alpn h2,http/1.1
{HAPROXY_FIELDS if fields else ""}  default_backend up
backend up
  {server}
""")
    proc = subprocess.Popen(pin(0, 1) + ["haproxy", "-f", conf, "-db"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, plain, tls


def start_h2o(binaries, tmp, certs, up_h1, up_h2, upstream_protocol):
    if upstream_protocol != "h1":
        return None, 0, 0
    plain, tls = free_port(), free_port()
    conf = os.path.join(tmp, "h2o.conf")
    with open(conf, "w") as f:
        f.write(f"""num-threads: 1
listen:
  host: 127.0.0.1
  port: {plain}
listen:
  host: 127.0.0.1
  port: {tls}
  ssl:
    certificate-file: {certs}/localhost.pem
    key-file: {certs}/localhost.key
proxy.timeout.keepalive: 60000
hosts:
  default:
    paths:
      /:
        proxy.reverse.url: http://127.0.0.1:{up_h1}/
""")
    proc = subprocess.Popen(pin(0, 1) + ["h2o", "-c", conf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, plain, tls


GATEWAYS = {"spindle": start_spindle,
            "spindle+chain": lambda *args: start_spindle(*args, chain=True),
            "spindle+log": lambda *args: start_spindle(*args, log_only=True),
            "spindle+1024": lambda *args: start_spindle(*args, max_connections=1024),
            "spindle+huge": lambda *args: start_spindle(*args, huge_page_stacks=True),
            "nginx": start_nginx, "haproxy": start_haproxy,
            "haproxy+fields": lambda *args: start_haproxy(*args, fields=True),
            "h2o": start_h2o}
# The peers spindle's ratios are printed against, in this order.
PEERS = ("nginx", "haproxy", "haproxy+fields", "h2o")


def run(kind, binaries, setup, connections, seconds, tmp, certs, upstream, syscalls=False,
        rps=None):
    name, tool, scheme, upstream_protocol = setup
    _, up_h1, up_h2 = upstream
    proc, plain, tls = GATEWAYS[kind](binaries, tmp, certs, up_h1, up_h2, upstream_protocol)
    if proc is None:
        return None
    port = tls if scheme == "https" else plain
    url = f"{scheme}://127.0.0.1:{port}/plaintext"
    try:
        wait_listening(plain, proc)
        wait_listening(tls, proc)
        # A warm-up of the measured load's own shape (same tool, connections and streams)
        # brings the gateway's upstream pool to its steady state first. With a single request
        # as warm-up, a gateway that opens upstream connections as the load grows (haproxy,
        # ~800 TLS connections to an HTTP/2 upstream at c100) paid for those handshakes inside
        # the measured run: its figure depended on the run's length, not on its steady cost.
        rate = ("--rps", str(rps)) if rps else ()
        measure(proc.pid, tool, url, connections, WARM_UP_SECONDS, rate)
        upstream_before = cpu_seconds(upstream[0].pid)
        result = measure(proc.pid, tool, url, connections, seconds, rate)
        result["upstream_us_per_request"] = cpu_us_per_request(
            upstream_before, cpu_seconds(upstream[0].pid), result["requests"])
        result["peak_rss_mb"] = peak_rss_mb(proc.pid)
        result["upstream_connections"] = upstream_connections(
            up_h1 if upstream_protocol == "h1" else up_h2)
        if syscalls:
            result["syscalls_per_request"] = count_syscalls(proc.pid, tool, url, connections,
                                                            SYSCALL_SECONDS, rate)
        return result
    finally:
        stop(proc)


WARM_UP_SECONDS = 2


def upstream_connections(port):
    """Connections established to the upstream's `port` now (the gateway's pool)."""
    out = subprocess.run(["ss", "-tnH", "state", "established", "dst", f"127.0.0.1:{port}"],
                         capture_output=True, text=True).stdout
    return len(out.splitlines())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "release", "bin"))
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="keep the median round by CPU/request")
    p.add_argument("--rps", type=int,
                   help="requests a second from each connection (h2load --rps), the same for "
                        "every gateway; the HTTP/2 set-ups only")
    p.add_argument("--gateways", default="spindle,nginx,haproxy,h2o",
                   help="of spindle, spindle+log (its access log on), spindle+chain (a typical "
                        "middleware chain and the access log), spindle+1024 (limits."
                        "max_connections: 1024), spindle+huge (huge_page_stacks: true), nginx, "
                        "haproxy, haproxy+fields (adding spindle's six fields), h2o")
    p.add_argument("--setups", default="", help="only these set-ups, by name (comma-separated)")
    p.add_argument("--connections", default="100,500")
    p.add_argument("--syscalls", action="store_true",
                   help="count each gateway's system calls per request in a run of its own "
                        "(perf stat on the raw_syscalls tracepoint: needs root)")
    p.add_argument("--bars", help="draw each gateway's CPU per request (total and user) as bars "
                                  "into this PNG")
    p.add_argument("--title", help="the chart's title (--bars)")
    p.add_argument("--replot", action="store_true",
                   help="measure nothing: draw --bars from the results already in --out")
    a = p.parse_args()
    if a.replot:
        if not a.bars:
            sys.exit("proxy_compare: --replot draws --bars; say where")
        with open(a.out) as f:
            bars(json.load(f)["results"], a.bars, a.title)
        return
    for tool in ("h2load", "wrk", "nginx", "haproxy", "h2o", "taskset", "openssl", "curl"):
        if not shutil.which(tool):
            sys.exit(f"proxy_compare: {tool} is not installed (make bench installs it)")
    cells = [(s, c) for s in SETUPS for c in map(int, a.connections.split(","))
             if not a.setups or s[0] in a.setups.split(",")]
    if a.rps and any(setup[1] != "h2load" for setup, _ in cells):
        sys.exit("proxy_compare: --rps needs h2load: choose the HTTP/2 set-ups "
                 "(--setups h2tls->h1,h2tls->h2); wrk has no fixed rate")
    results = []
    certs = tempfile.mkdtemp(prefix="spindle-bench-certs-")
    upstream_tmp = tempfile.mkdtemp(prefix="spindle-bench-upstream-")
    upstream = None
    try:
        os.chmod(certs, 0o755)
        subprocess.run([os.path.join(ROOT, "tests", "tls", "make-certs.sh"), certs], check=True)
        for f in os.listdir(certs):
            os.chmod(os.path.join(certs, f), 0o644)
        upstream = start_upstream(upstream_tmp, certs)
        gateways = a.gateways.split(",")
        for i, (setup, connections) in enumerate(cells, 1):
            # The gateways take turns round by round (A, B, C, A, B, C...), not all of A's
            # rounds first: the machine's drift over minutes then falls on each alike.
            rounds = {kind: [] for kind in gateways}
            for n in range(a.rounds):
                for kind in gateways:
                    if n > 0 and not rounds[kind]:
                        continue  # it cannot proxy to that upstream protocol
                    print(f"  [{i}/{len(cells)}] {setup[0]}, {connections} connections, round "
                          f"{n + 1}/{a.rounds}: {kind}", flush=True)
                    with tempfile.TemporaryDirectory() as tmp:
                        os.chmod(tmp, 0o755)
                        r = run(kind, a.bin, setup, connections, a.seconds, tmp, certs, upstream,
                                a.syscalls, a.rps)
                        if r is not None:
                            rounds[kind].append(r)
            for kind in gateways:
                if not rounds[kind]:
                    print(f"      {kind:<14} n/a (cannot proxy to that upstream protocol)")
                    continue
                r = median_round(rounds[kind])
                r.update({"server": kind, "setup": setup[0], "connections": connections})
                print(f"      {kind:<14} {r['rps']:>10,.0f} req/s  CPU "
                      f"{r['cpu_us_per_request'] or 0:.2f} us/req"
                      f" (user {r.get('user_us_per_request') or 0:.2f}){syscalls_text(r)}"
                      f"  {r.get('segments_per_request') or 0:.2f} segments/req"
                      f"  errors {r['errors']}  upstream conns {r['upstream_connections']}"
                      f" (CPU {r['upstream_us_per_request'] or 0:.2f} us/req)"
                      f"  peak RSS {r['peak_rss_mb']:.0f} MiB",
                      flush=True)
                results.append(r)
    finally:
        if upstream:
            stop(upstream[0])
        shutil.rmtree(certs)
        shutil.rmtree(upstream_tmp, ignore_errors=True)
    by = {(r["server"], r["setup"], r["connections"]): r for r in results}
    print("\n  gateway CPU per proxied request, spindle's ratio to each peer:")
    for name, *_ in SETUPS:
        for c in map(int, a.connections.split(",")):
            s = by.get(("spindle", name, c))
            if not s or not s["cpu_us_per_request"]:
                continue
            ratios = []
            for peer in PEERS:
                q = by.get((peer, name, c))
                if q and q["cpu_us_per_request"]:
                    ratios.append(f"{ratio_text(s, q)} {peer}")
            print(f"    {name:<10} c{c:<4} {s['cpu_us_per_request']:7.2f} us/req  "
                  + ", ".join(ratios))
            for variant, what in (("spindle+log", "the access log alone"),
                                  ("spindle+chain", "the typical chain")):
                v = by.get((variant, name, c))
                if v and v["cpu_us_per_request"]:
                    print(f"    {'':<10} {'':<5} {v['cpu_us_per_request']:7.2f} us/req with {what}:"
                          f" {v['cpu_us_per_request'] / s['cpu_us_per_request']:.2f}x the bare "
                          "proxy")
    write_results(a.out, {"seconds": a.seconds, "rounds": a.rounds, "rps": a.rps,
                          "results": results}, indent=2)
    if a.bars:
        bars(results, a.bars, a.title)


def bars(results, path, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    chain = any(r["server"].startswith("spindle+") for r in results)
    # (A set-up's name may carry how it was loaded after a space: a line of its own.)
    names = [f"{r['server']}\n{r['setup'].replace(' ', chr(10))} c{r['connections']}"
             for r in results]
    total = [r["cpu_us_per_request"] or 0 for r in results]
    user = [r.get("user_us_per_request") or 0 for r in results]
    # The upstream's CPU per request behind each gateway, where the run measured it.
    upstream = [r.get("upstream_us_per_request") or 0 for r in results]
    fig, ax = plt.subplots(figsize=(max(8, 1.25 * len(results)), 4.2))
    x = range(len(results))
    width = 0.27 if any(upstream) else 0.4
    ax.bar([i - width / 2 - (width / 2 if any(upstream) else 0) for i in x], total, width,
           label="CPU (user + system)")
    ax.bar([i + width / 2 - (width / 2 if any(upstream) else 0) for i in x], user, width,
           label="user only")
    if any(upstream):
        ax.bar([i + width for i in x], upstream, width, label="the upstream's CPU (nginx)")
    # TCP segments a request on loopback (all parties), where the run counted them.
    for i, r in enumerate(results):
        if r.get("segments_per_request"):
            ax.annotate(f"{r['segments_per_request']:.2f} seg/req", (i, max(total[i], upstream[i])),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set_ylabel("µs per proxied request")
    ax.set_ylim(top=1.3 * max(total + upstream + [1]))  # room for the legend above the bars
    ax.legend(ncol=3, fontsize=8, loc="upper center")
    plt.title(title or ("Gateway CPU per request: the middleware chain against the bare proxy"
                        if chain else "Gateway CPU per proxied request, one worker each (same run)"))
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
