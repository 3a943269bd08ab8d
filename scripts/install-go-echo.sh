#!/usr/bin/env bash
# Builds the Go net/http upstreams of the tests with the Go toolchain (the standard library
# only), each again whenever its source is newer than the binary: tests/frameworks/go (the
# framework tests' echo) into build/tools/go-echo, tests/frameworks/go-h2c (an h2c upstream
# that answers before reading the body) into build/tools/go-h2c-early.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null || { echo "install-go-echo: go is not installed (scripts/install-deps.sh test)" >&2; exit 1; }
mkdir -p build/tools
build() {  # build DIR SOURCE OUT
  local out=build/tools/$3
  [ -x "$out" ] && [ "$out" -nt "tests/frameworks/$1/$2" ] && return 0
  (cd "tests/frameworks/$1" && go build -o ../../../"$out" .)
}
build go echo.go go-echo
build go-h2c early.go go-h2c-early
