#!/usr/bin/env bash
# A spindle built from a profile of its own load (profile-guided optimization, GCC):
#   1. build/pgo-gen: an instrumented spindle (SPINDLE_PGO=generate);
#   2. training: it serves the loads of the benchmarks (HTTP/1.1, h2c, HTTP/2 and HTTPS, the
#      proxy to an HTTP/1.1 and to an HTTP/2 upstream), each bounded in time, on 127.0.0.1;
#      the profile is written into build/pgo-profile as the processes exit;
#   3. build/pgo: spindle built from that profile (SPINDLE_PGO=use): build/pgo/bin/spindle.
# Needs wrk and h2load (make deps-bench). docs/performance.md has what it changes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
profile=$root/build/pgo-profile
seconds=${PGO_SECONDS:-3}
for tool in wrk h2load openssl; do
  command -v $tool >/dev/null || { echo "pgo.sh: $tool is missing (make deps-bench)" >&2; exit 2; }
done

configure() {  # configure DIR MODE
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPINDLE_BUILD_TESTS=OFF \
    -DSPINDLE_BUILD_BENCH=OFF -DSPINDLE_PGO="$2" -DSPINDLE_PGO_DIR="$profile" >/dev/null
}

echo "pgo: [1/3] instrumented build (build/pgo-gen)"
configure build/pgo-gen generate
ninja -C build/pgo-gen spindle

echo "pgo: [2/3] training loads, ${seconds}s each"
rm -rf "$profile"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
tests/tls/make-certs.sh "$tmp/certs" >/dev/null 2>&1
source scripts/ports.sh  # free_port, wait_port
bin=build/pgo-gen/bin/spindle
up_h1=$(free_port); up_h2=$(free_port); plain=$(free_port); tls=$(free_port)
tls_keys="tls: {cert: $tmp/certs/localhost.pem, key: $tmp/certs/localhost.key}"
cat > "$tmp/upstream.yaml" <<EOF
servers:
  - {listen: 127.0.0.1:$up_h1, default_site: true, compression: false, access_log: off}
  - {listen: 127.0.0.1:$up_h2, default_site: true, compression: false, access_log: off,
     http2: true, $tls_keys}
EOF
site() {  # the front spindle's servers, then what it serves (a route, or the default site)
  cat <<EOF
servers:
  - {listen: 127.0.0.1:$plain, default_site: $1, root: $root/bench/http, compression: false,
     access_log: off, http2: true}
  - {listen: 127.0.0.1:$tls, default_site: $1, root: $root/bench/http, compression: false,
     access_log: off, http2: true, $tls_keys}
EOF
}
site true > "$tmp/hello.yaml"
{ site false; cat <<EOF
routes:
  - {name: all, match: {path_prefix: /}, service: up}
services:
  up: {url: "http://127.0.0.1:$up_h1"}
EOF
} > "$tmp/proxy-h1.yaml"
{ site false; cat <<EOF
routes:
  - {name: all, match: {path_prefix: /}, service: up}
services:
  up: {url: "https://localhost:$up_h2", protocol: h2, tls: {ca: $tmp/certs/ca.pem}}
EOF
} > "$tmp/proxy-h2.yaml"

"$bin" serve --config "$tmp/upstream.yaml" > "$tmp/upstream.log" 2>&1 &
pids+=($!)
wait_port "$up_h1" || { cat "$tmp/upstream.log" >&2; exit 1; }
load() {  # load NAME COMMAND...: runs one load, prints its name and result line
  local name=$1 out line
  shift
  out=$("$@" 2>&1) || true
  line=$(grep -E '^Requests/sec|^requests:' <<<"$out" | head -1) || true
  if [ -z "$line" ]; then
    printf 'pgo.sh: the load "%s" gave no result:\n%s\n' "$name" "$out" >&2
    exit 1
  fi
  printf '  %-28s %s\n' "$name" "$line"
}
for conf in hello proxy-h1 proxy-h2; do
  echo " $conf:"
  "$bin" serve --config "$tmp/$conf.yaml" --threads 1 > "$tmp/$conf.log" 2>&1 &
  front=$!
  pids+=($front)
  wait_port "$plain" && wait_port "$tls" || { cat "$tmp/$conf.log" >&2; exit 1; }
  load "http/1.1 keep-alive c100" wrk -t1 -c100 -d${seconds}s "http://127.0.0.1:$plain/plaintext"
  load "http/1.1 close c50" wrk -t1 -c50 -d${seconds}s -H 'Connection: close' \
    "http://127.0.0.1:$plain/plaintext"
  load "https keep-alive c100" wrk -t1 -c100 -d${seconds}s "https://127.0.0.1:$tls/plaintext"
  load "h2c c100 m10" h2load -c100 -m10 -D "$seconds" "http://127.0.0.1:$plain/plaintext"
  load "h2 TLS c100 m10" h2load -c100 -m10 -D "$seconds" "https://127.0.0.1:$tls/plaintext"
  load "h2 TLS c500 m10" h2load -c500 -m10 -D "$seconds" "https://127.0.0.1:$tls/plaintext"
  kill -TERM "$front"
  wait "$front" || true
  pids=("${pids[0]}")
done
kill -TERM "${pids[0]}"
wait "${pids[0]}" || true
pids=()
count=$(find "$profile" -name '*.gcda' 2>/dev/null | wc -l)
[ "$count" -gt 0 ] || { echo "pgo.sh: no profile was written into $profile" >&2; exit 1; }
echo "pgo: profile of $count objects in $profile"

echo "pgo: [3/3] build from the profile (build/pgo)"
# From scratch: ninja does not know the profile is an input of every object.
rm -rf build/pgo
configure build/pgo use
ninja -C build/pgo spindle
echo "pgo: built build/pgo/bin/spindle"
