#!/usr/bin/env bash
# Userspace instructions per keep-alive request, counted by callgrind: unlike CPU time, the
# count does not move with the machine's noise, so it shows what a change to the request path
# costs or saves. Runs spindle (1 worker) and the C ceiling under callgrind, drives each with
# wrk -c100 on loopback for SECONDS, and prints instructions per request (kernel time is not
# counted: both make the same syscalls per request).
#   bench/instructions.sh [SECONDS]   (default 6; needs valgrind and wrk)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-6}
bin=build/release/bin
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"' EXIT
for tool in valgrind wrk callgrind_annotate; do
  command -v "$tool" >/dev/null || { echo "instructions.sh: $tool is not installed" >&2; exit 1; }
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# measure NAME PORT ARGV...: starts ARGV under callgrind, loads it, dumps, stops it by PID.
measure() {
  local name=$1 port=$2
  shift 2
  valgrind --tool=callgrind --callgrind-out-file="$tmp/$name.out" "$@" >"$tmp/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  local requests
  requests=$(wrk -t1 -c100 -d"${seconds}s" "http://127.0.0.1:$port/plaintext" |
    awk '/requests in/ {print $1}')
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  local total=0
  for f in "$tmp/$name.out"*; do
    local n
    n=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
    total=$((total + ${n:-0}))
  done
  echo "$name $requests $total" | awk '{printf "%-8s %9d requests  %7.0f instructions/request\n", $1, $2, $3 / $2}'
}

port=$(free_port)
sed "s|127.0.0.1:0|127.0.0.1:$port|; s|bench/http|$PWD/bench/http|" bench/http/spindle.yaml \
  >"$tmp/spindle.yaml"
measure spindle "$port" "$bin/spindle" serve --config "$tmp/spindle.yaml" --threads 1
port=$(free_port)
measure ceiling "$port" "$bin/http_ceiling" "$port"
