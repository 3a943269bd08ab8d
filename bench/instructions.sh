#!/usr/bin/env bash
# Userspace instructions per keep-alive request, counted by callgrind: unlike CPU time, the
# count does not move with the machine's noise, so it shows what a change to the request path
# costs or saves. Runs spindle (1 worker) and the C ceiling under callgrind, drives each with
# wrk -c100 on loopback for SECONDS, and prints instructions per request (kernel time is not
# counted: both make the same syscalls per request).
# Each server runs twice (SECONDS, then twice that); the difference is divided by the
# difference in requests, so start-up costs cancel. With OUT=file, writes the figures as JSON.
#   bench/instructions.sh [SECONDS]   (default 4; needs valgrind and wrk)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-4}
bin=build/release/bin
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"' EXIT
for tool in valgrind wrk callgrind_annotate; do
  command -v "$tool" >/dev/null || { echo "instructions.sh: $tool is not installed" >&2; exit 1; }
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run NAME PORT SECONDS ARGV...: starts ARGV under callgrind, loads it with wrk for SECONDS,
# stops it by PID; prints "<requests> <instructions>" (the whole run, start-up included).
run() {
  local name=$1 port=$2 secs=$3
  shift 3
  rm -f "$tmp/$name.out"*
  valgrind --tool=callgrind --callgrind-out-file="$tmp/$name.out" "$@" >"$tmp/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  local requests
  requests=$(wrk -t1 -c100 -d"${secs}s" "http://127.0.0.1:$port/plaintext" |
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
  echo "$requests $total"
}

# measure NAME PORT ARGV...: a run of SECONDS and one of twice that; the difference of the
# two cancels start-up and connection set-up, leaving instructions per request.
measure() {
  local name=$1 port=$2
  shift 2
  local short long
  short=$(run "$name" "$port" "$seconds" "$@")
  long=$(run "$name" "$port" $((seconds * 2)) "$@")
  echo "$name $short $long" | awk -v file="$tmp/per_request" '{
    per = ($5 - $3) / ($4 - $2)
    printf "%-8s %9d requests  %7.0f instructions/request\n", $1, $4 - $2, per
    printf "%s %.0f\n", $1, per >> file }'
}

port=$(free_port)
sed "s|127.0.0.1:0|127.0.0.1:$port|; s|bench/http|$PWD/bench/http|" bench/http/spindle.yaml \
  >"$tmp/spindle.yaml"
measure spindle "$port" "$bin/spindle" serve --config "$tmp/spindle.yaml" --threads 1
port=$(free_port)
measure ceiling "$port" "$bin/http_ceiling" "$port"
if [ -n "${OUT:-}" ]; then
  awk 'BEGIN {printf "{"} {printf "%s\"%s\": %s", (NR == 1 ? "" : ", "), $1, $2} END {print "}"}' \
    "$tmp/per_request" >"$OUT"
fi
