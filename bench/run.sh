#!/usr/bin/env bash
# make bench: the runtime's micro-benchmarks next to ucontext/pthreads, then echo throughput of
# spindle against a plain C epoll echo server, measured in the same run. Writes
# docs/benchmarks.md and docs/benchmarks.png. Loopback only; every process it starts it stops.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/release/bin
out=bench/results
mkdir -p "$out"
py=/usr/bin/python3   # Debian's python3, which has python3-matplotlib

echo "[bench 1/3] micro-benchmarks (fiber_bench, 3 repetitions)"
"$bin/fiber_bench" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.3 --benchmark_out="$out/micro.json" --benchmark_out_format=json

echo "[bench 2/3] echo throughput: spindle (1 worker) vs epoll_echo.c"
"$py" bench/echo_compare.py --bin "$bin" --out "$out/echo.json" ${ECHO_SECONDS:+--seconds "$ECHO_SECONDS"}

echo "[bench 3/3] writing docs/benchmarks.md and docs/benchmarks.png"
"$py" bench/report.py --micro "$out/micro.json" --echo "$out/echo.json" \
  --markdown docs/benchmarks.md --chart docs/benchmarks.png
