#!/usr/bin/env bash
# Where a proxied request's time goes beyond its instructions: cache misses per request,
# simulated by callgrind, for spindle and for h2o as the same gateway (HTTP/2 over TLS in front,
# h2load -c100 -m10, to one nginx upstream over HTTP/1.1 that runs outside callgrind). The
# second-level cache simulated is this machine's L2 (getconf; 2 MiB 16-way when it says
# nothing), so "L2 misses" are the reads and writes that had to go further than the core's own
# caches. Like bench/instructions.sh the figures do not move with the machine's noise: each
# gateway runs twice (10,000 then 40,000 requests), the difference of the totals divided by the
# difference of the requests cancels start-up and connection set-up.
#   bench/cache_misses.sh            (needs valgrind, h2load, nginx, h2o; about 3 minutes)
#   BIN=dir OUT=file.json bench/cache_misses.sh
#   BIN=dir SPINDLE_ONLY=1 bench/cache_misses.sh   (an A/B of two builds: h2o is not run)
#   UPSTREAM=h2 bench/cache_misses.sh   (spindle only, to nginx over HTTP/2 with TLS: h2 -> h2)
# Prints, for each gateway: instructions, first-level instruction-cache misses, first-level
# data-cache misses and L2 misses (data) per request, and spindle's ratio to h2o.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/release/bin}
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"' EXIT
for tool in valgrind h2load nginx h2o callgrind_control; do
  command -v "$tool" >/dev/null || { echo "cache_misses.sh: $tool is not installed" >&2; exit 1; }
done
source scripts/ports.sh  # free_port, wait_port
source bench/callgrind_lib.sh  # callgrind_run, start_nginx_upstream

l2_size=$(getconf LEVEL2_CACHE_SIZE 2>/dev/null || true)
l2_assoc=$(getconf LEVEL2_CACHE_ASSOC 2>/dev/null || true)
l2_line=$(getconf LEVEL2_CACHE_LINESIZE 2>/dev/null || true)
[[ ${l2_size:-0} =~ ^[1-9][0-9]*$ ]] || l2_size=2097152
[[ ${l2_assoc:-0} =~ ^[1-9][0-9]*$ ]] || l2_assoc=16
[[ ${l2_line:-0} =~ ^[1-9][0-9]*$ ]] || l2_line=64
echo "simulated caches: callgrind's first level (this machine's), L2 $((l2_size / 1024)) KiB" \
  "$l2_assoc-way, $l2_line-byte lines"

start_nginx_upstream "$tmp"
trap 'kill "$nginx_pid" 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"' EXIT
wait_port "$up_port" || { echo "cache_misses.sh: nginx does not listen" >&2; exit 1; }

# load PORT REQUESTS, for callgrind_run: h2load over h2 with TLS; prints the requests answered.
load() {
  h2load -c100 -m10 -n "$2" "https://127.0.0.1:$1/plaintext" | awk '/^requests:/ {print $8}'
}
callgrind_options=(--dump-instr=no --cache-sim=yes "--LL=$l2_size,$l2_assoc,$l2_line")

# measure NAME PORT ARGV...: 10,000 then 40,000 requests; prints and keeps the differences
# per request: instructions, I1 misses, D1 misses (reads + writes), L2 misses (reads + writes).
measure() {
  local name=$1 port=$2
  shift 2
  local short long
  short=$(callgrind_run "$name" "$port" 10000 load "$@")
  long=$(callgrind_run "$name" "$port" 40000 load "$@")
  # Each: requests Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw ($2..$11 short, $12..$21 long).
  echo "$name $short $long" | awk -v file="$tmp/per_request" '{
    n = $12 - $2
    if (n <= 0) { print $1 ": no requests were answered" > "/dev/stderr"; exit 1 }
    ir = ($13 - $3) / n; i1 = ($16 - $6) / n; d1 = ($17 + $18 - $7 - $8) / n
    l2 = ($20 + $21 - $10 - $11) / n
    printf "%-8s %6d requests  %7.0f instructions  %5.0f I1 misses  %5.0f D1 misses  %5.0f L2 misses /request\n",
      $1, n, ir, i1, d1, l2
    printf "%s %.0f %.0f %.0f %.0f\n", $1, ir, i1, d1, l2 >> file }'
}

spindle_port=$(free_port)
cat >"$tmp/spindle.yaml" <<CONF
servers:
  - listen: 127.0.0.1:$spindle_port
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
if [ "${UPSTREAM:-h1}" = h2 ]; then  # h2o has no HTTP/2 upstream: spindle alone
  sed -i "s|up: {url: .*|up: {url: \"https://localhost:$up_h2_port\", protocol: h2, tls: {ca: $tmp/certs/ca.pem}}|" \
    "$tmp/spindle.yaml"
  SPINDLE_ONLY=1
fi
measure spindle "$spindle_port" "$bin/spindle" serve --config "$tmp/spindle.yaml" --threads 1
[ -n "${SPINDLE_ONLY:-}" ] && exit 0

# h2o as bench/proxy_compare.py runs it; it keeps the user it was started as (as root it would
# become nobody, and callgrind_control could no longer ask it to write its counts).
h2o_port=$(free_port)
cat >"$tmp/h2o.conf" <<CONF
num-threads: 1
user: $(id -un)
listen:
  host: 127.0.0.1
  port: $h2o_port
  ssl:
    certificate-file: $tmp/certs/localhost.pem
    key-file: $tmp/certs/localhost.key
proxy.timeout.keepalive: 60000
hosts:
  default:
    paths:
      /:
        proxy.reverse.url: http://127.0.0.1:$up_port/
CONF
measure h2o "$h2o_port" h2o -c "$tmp/h2o.conf"

awk '{ for (i = 2; i <= 5; i++) v[$1, i] = $i }
  END { printf "spindle / h2o: instructions %.2fx, I1 misses %.2fx, D1 misses %.2fx, L2 misses %.2fx\n",
          v["spindle", 2] / v["h2o", 2], v["spindle", 3] / v["h2o", 3],
          v["spindle", 4] / v["h2o", 4], v["spindle", 5] / v["h2o", 5] }' "$tmp/per_request"
if [ -n "${OUT:-}" ]; then
  awk 'BEGIN {printf "{"} {printf "%s\"%s\": {\"instructions\": %s, \"i1_misses\": %s, \"d1_misses\": %s, \"l2_misses\": %s}", (NR == 1 ? "" : ", "), $1, $2, $3, $4, $5} END {print "}"}' \
    "$tmp/per_request" >"$OUT"
fi
