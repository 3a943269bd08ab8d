#!/usr/bin/env bash
# make bench: the runtime's micro-benchmarks next to ucontext/pthreads, echo throughput of
# spindle against a plain C epoll echo server, and HTTP/1.1 against nginx, h2o and a C ceiling,
# each measured in the same run as its peers. Replaces the `make bench` section of
# docs/benchmarks.md and its charts (the page's other sections are `make goals`' and `make soak`'s).
# Loopback only; every process it starts it stops, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/release/bin
out=bench/results
mkdir -p "$out"
py=/usr/bin/python3   # Debian's python3, which has python3-matplotlib
# Each load run is repeated and the median (by server CPU per request) kept: single runs move
# by ±15% on a shared machine. BENCH_ROUNDS=1 for a quick look.
rounds=${BENCH_ROUNDS:-3}

echo "[bench 1/11] micro-benchmarks (fiber_bench, 3 repetitions)"
"$bin/fiber_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.3 --benchmark_out="$out/micro.json" --benchmark_out_format=json

echo "[bench 2/11] echo throughput: spindle (1 worker) vs epoll_echo.c"
"$py" bench/echo_compare.py --bin "$bin" --out "$out/echo.json" ${ECHO_SECONDS:+--seconds "$ECHO_SECONDS"}

echo "[bench 3/11] HTTP/1.1: spindle vs nginx, h2o and the C ceiling (wrk; 1 worker, then 2)"
"$py" bench/http_compare.py --bin "$bin" --out "$out/http.json" --rounds "$rounds" \
  ${HTTP_SECONDS:+--seconds "$HTTP_SECONDS"}

echo "[bench 4/11] HTTPS and HTTP/2: spindle vs nginx and h2o (h2load, wrk; 1 worker)"
"$py" bench/tls_compare.py --bin "$bin" --out "$out/tls.json" --rounds "$rounds" --syscalls \
  ${HTTP_SECONDS:+--seconds "$HTTP_SECONDS"}

echo "[bench 5/11] memory of 10,000 idle keep-alive connections: spindle vs nginx"
"$py" bench/idle_rss.py --bin "$bin" --out "$out/idle_rss.json"

echo "[bench 6/11] userspace instructions per request: spindle vs the C ceiling, and h2c (callgrind)"
OUT="$out/instructions.json" bench/instructions.sh

echo "[bench 7/11] reverse proxy: spindle vs nginx, haproxy and h2o (h1->h1, https->h1, h2tls->h1, h2tls->h2; 100 and 500 connections)"
"$py" bench/proxy_compare.py --bin "$bin" --out "$out/proxy.json" --rounds "$rounds" --syscalls \
  ${HTTP_SECONDS:+--seconds "$HTTP_SECONDS"}

echo "[bench 8/11] WebSocket echo through the gateway: spindle vs haproxy (HTTP/1.1 and HTTP/2 clients; 64 B and 16 KiB)"
"$py" bench/websocket_compare.py --bin "$bin" --out "$out/websocket.json" --rounds "$rounds" \
  ${HTTP_SECONDS:+--seconds "$HTTP_SECONDS"}

echo "[bench 9/11] databases: the TechEmpower test types, spindle (native and hooked) vs Go (fasthttp + pgx), 256 connections"
"$py" bench/db_compare.py --bin "$bin" --out "$out/db.json" --rounds "$rounds" \
  ${HTTP_SECONDS:+--seconds "$HTTP_SECONDS"}

echo "[bench 10/11] the gateway under hard loads: slow upstream, 1 MB each way, a connection a request, slow readers (vs nginx, haproxy, h2o)"
"$py" bench/hard_loads.py --bin "$bin" --out "$out/hard_loads.json" --rounds "$rounds" \
  --bars docs/benchmarks-hard-loads.png ${HTTP_SECONDS:+--seconds "$HTTP_SECONDS"}

echo "[bench 11/11] writing docs/benchmarks.md's make bench section and its charts"
"$py" bench/report.py --micro "$out/micro.json" --echo "$out/echo.json" --http "$out/http.json" \
  --idle-rss "$out/idle_rss.json" --tls "$out/tls.json" --tls-chart docs/benchmarks-tls.png \
  --instructions "$out/instructions.json" --proxy "$out/proxy.json" \
  --proxy-chart docs/benchmarks-proxy.png \
  --websocket "$out/websocket.json" --websocket-chart docs/benchmarks-websocket.png \
  --db "$out/db.json" --db-chart docs/benchmarks-db.png \
  --hard-loads "$out/hard_loads.json" --hard-loads-chart docs/benchmarks-hard-loads.png \
  --markdown docs/benchmarks.md --chart docs/benchmarks.png --http-chart docs/benchmarks-http.png
