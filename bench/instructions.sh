#!/usr/bin/env bash
# Userspace instructions per request, counted by callgrind: unlike CPU time, the count does
# not move with the machine's noise, so it shows what a change to the request path costs or
# saves. Runs spindle (1 worker) and the C ceiling under callgrind, drives each with wrk -c100
# keep-alive on loopback for SECONDS (and again with wrk -c10: below), and prints instructions
# per request (kernel time is not counted: spindle makes one recv and one send per request,
# the ceiling one recv more); then spindle over h2c with h2load -c10 -m10 (no peer here:
# bench/cache_misses.sh runs h2o under callgrind as a gateway, beside spindle); then spindle
# as a reverse proxy to an nginx upstream (not under callgrind), h1->h1 with wrk -c100, h2
# over TLS->h1 and h2 over TLS->h2 over TLS (proxy-h2up) with h2load -c100 -m10 (10,000 then
# 40,000 requests).
# Each server runs twice (SECONDS, then twice that; or 5,000 then 15,000 h2c requests); the
# difference is divided by the difference in requests, so start-up and connection set-up
# cancel. With OUT=file, writes the figures as JSON.
#   bench/instructions.sh [SECONDS]   (default 4; needs valgrind, wrk and h2load)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-4}
bin=${BIN:-build/release/bin}  # BIN=dir: another build's binaries
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"' EXIT
for tool in valgrind wrk h2load callgrind_control nginx; do
  command -v "$tool" >/dev/null || { echo "instructions.sh: $tool is not installed" >&2; exit 1; }
done

source scripts/ports.sh  # free_port, wait_port (the working folder is the top of the tree)
source bench/callgrind_lib.sh  # callgrind_run, start_nginx_upstream

# load PORT AMOUNT, for callgrind_run: wrk for AMOUNT seconds (-c10 for a server named *-c10,
# else -c100), or for a server named *-h2c or *-h2tls (in $name, set by measure) h2load for
# AMOUNT requests; prints the requests answered.
load() {
  if [[ $name == *-c10 ]]; then
    wrk -t1 -c10 -d"${2}s" "http://127.0.0.1:$1/plaintext" | awk '/requests in/ {print $1}'
  elif [[ $name == *-h2c ]]; then
    h2load -c10 -m10 -n "$2" "http://127.0.0.1:$1/plaintext" | awk '/^requests:/ {print $8}'
  elif [[ $name == *-h2tls ]]; then
    h2load -c100 -m10 -n "$2" "https://127.0.0.1:$1/plaintext" | awk '/^requests:/ {print $8}'
  else
    wrk -t1 -c100 -d"${2}s" "http://127.0.0.1:$1/plaintext" | awk '/requests in/ {print $1}'
  fi
}

# measure NAME PORT SHORT LONG ARGV...: a short run and a long one; their difference cancels
# start-up and connection set-up, leaving instructions per request.
measure() {
  name=$1
  local port=$2 short_amount=$3 long_amount=$4
  shift 4
  local short long
  short=$(callgrind_run "$name" "$port" "$short_amount" load "$@")
  long=$(callgrind_run "$name" "$port" "$long_amount" load "$@")
  echo "$name $short $long" | awk -v file="$tmp/per_request" '{
    per = ($5 - $3) / ($4 - $2)
    printf "%-16s %9d requests  %7.0f instructions/request\n", $1, $4 - $2, per
    printf "%s %.0f\n", $1, per >> file }'
}

port=$(free_port)
sed "s|127.0.0.1:0|127.0.0.1:$port|; s|bench/http|$PWD/bench/http|" bench/http/spindle.yaml \
  >"$tmp/spindle.yaml"
measure spindle "$port" "$seconds" $((seconds * 2)) \
  "$bin/spindle" serve --config "$tmp/spindle.yaml" --threads 1
port=$(free_port)
measure ceiling "$port" "$seconds" $((seconds * 2)) "$bin/http_ceiling" "$port"
# Under callgrind a server runs some 50x slower, so at c100 each poll finds ~100 requests where
# the real run finds ~9: what a server does per poll (fibers started, the loop's own checks)
# nearly vanishes. With 10 connections each poll finds at most 10, as in the real run.
port=$(free_port)
sed "s|127.0.0.1:0|127.0.0.1:$port|; s|bench/http|$PWD/bench/http|" bench/http/spindle.yaml \
  >"$tmp/spindle-c10.yaml"
measure spindle-c10 "$port" "$seconds" $((seconds * 2)) \
  "$bin/spindle" serve --config "$tmp/spindle-c10.yaml" --threads 1
port=$(free_port)
measure ceiling-c10 "$port" "$seconds" $((seconds * 2)) "$bin/http_ceiling" "$port"
port=$(free_port)
sed "s|127.0.0.1:0|127.0.0.1:$port|; s|bench/http|$PWD/bench/http|; \$a\    http2: true" \
  bench/http/spindle.yaml >"$tmp/spindle-h2c.yaml"
measure spindle-h2c "$port" 5000 15000 \
  "$bin/spindle" serve --config "$tmp/spindle-h2c.yaml" --threads 1
# The reverse proxy: nginx (one worker, outside callgrind) answers /plaintext as the upstream,
# over HTTP/1.1 and over HTTP/2 with TLS.
start_nginx_upstream "$tmp"
trap 'kill "$nginx_pid" 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"' EXIT
wait_port "$up_port" || exit 1
proxy_port=$(free_port)
tls_port=$(free_port)
cat >"$tmp/proxy.yaml" <<CONF
servers:
  - {listen: 127.0.0.1:$proxy_port, default_site: false, compression: false, access_log: off}
  - listen: 127.0.0.1:$tls_port
    default_site: false
    compression: false
    access_log: off
    http2: true
    tls: {cert: $tmp/certs/localhost.pem, key: $tmp/certs/localhost.key}
routes:
  - {name: all, match: {path_prefix: /}, service: up}
services:
  up: {url: "http://127.0.0.1:$up_port"}
CONF
measure proxy-h1 "$proxy_port" "$seconds" $((seconds * 2)) \
  "$bin/spindle" serve --config "$tmp/proxy.yaml" --threads 1
measure proxy-h2tls "$tls_port" 10000 40000 \
  "$bin/spindle" serve --config "$tmp/proxy.yaml" --threads 1
sed "s|up: {url: .*|up: {url: \"https://localhost:$up_h2_port\", protocol: h2, tls: {ca: $tmp/certs/ca.pem}}|" \
  "$tmp/proxy.yaml" >"$tmp/proxy-h2.yaml"
measure proxy-h2up-h2tls "$tls_port" 10000 40000 \
  "$bin/spindle" serve --config "$tmp/proxy-h2.yaml" --threads 1
if [ -n "${OUT:-}" ]; then
  awk 'BEGIN {printf "{"} {printf "%s\"%s\": %s", (NR == 1 ? "" : ", "), $1, $2} END {print "}"}' \
    "$tmp/per_request" >"$OUT"
fi
