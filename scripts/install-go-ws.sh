#!/usr/bin/env bash
# Builds the Go net/http WebSocket upstream of the RFC 8441 tests (tests/frameworks/go-ws, the
# standard library only) into build/tools/go-ws with the Go toolchain, again whenever its source
# is newer than the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/tools/go-ws
[ -x "$out" ] && [ "$out" -nt tests/frameworks/go-ws/main.go ] && exit 0
command -v go >/dev/null || { echo "install-go-ws: go is not installed (scripts/install-deps.sh test)" >&2; exit 1; }
mkdir -p build/tools
(cd tests/frameworks/go-ws && go build -o ../../../"$out" .)
