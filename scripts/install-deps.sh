#!/usr/bin/env bash
# Installs the Debian packages spindle needs to build, test or benchmark.
# Usage: scripts/install-deps.sh [build|test|bench]...  (default: build)
# A no-op when everything is present; needs root (or sudo) otherwise.
set -euo pipefail

# The build configures the unit tests too (one build tree for make build and make test), so
# GoogleTest is a build dependency.
build_pkgs=(build-essential cmake ninja-build pkg-config
  libboost-context-dev libfmt-dev libcli11-dev libyaml-cpp-dev zlib1g-dev libbrotli-dev
  libssl-dev libnghttp2-dev libre2-dev libhiredis-dev libc-ares-dev nlohmann-json3-dev valgrind
  googletest libgtest-dev libgmock-dev libpq-dev libpqxx-dev libcurl4-openssl-dev)
test_pkgs=(python3 python3-pytest python3-pytest-xdist python3-h2 python3-websockets python3-brotli python3-yaml python3-prometheus-client python3-jwt python3-cryptography curl openssl
  nghttp2-client nghttp2-server wrk golang-go nginx-light h2o redis-server postgresql
  clang-format clang-19 libclang-rt-19-dev lintian dpkg-dev man-db systemd
  python3-flask nodejs)
# npm installs Express for the framework tests (scripts/install-express.sh): Debian's package,
# unless the Node.js installed brings its own (NodeSource's does, and conflicts with Debian's).
command -v npm >/dev/null || test_pkgs+=(npm)
bench_pkgs=(libbenchmark-dev python3-matplotlib nginx-light h2o haproxy wrk util-linux nghttp2-client
  valgrind iproute2 linux-perf)

want=("${build_pkgs[@]}")
for set in "$@"; do
  case "$set" in
    build) ;;
    test) want+=("${test_pkgs[@]}") ;;
    bench) want+=("${test_pkgs[@]}" "${bench_pkgs[@]}") ;;
    *) echo "install-deps: unknown set '$set' (build|test|bench)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root to apt-get install ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
