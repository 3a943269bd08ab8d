#!/usr/bin/env bash
# Builds the Go net/http upstream of the framework tests (tests/frameworks/go, the standard
# library only) into build/tools/go-echo with the Go toolchain, again whenever its source is
# newer than the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/tools/go-echo
[ -x "$out" ] && [ "$out" -nt tests/frameworks/go/echo.go ] && exit 0
command -v go >/dev/null || { echo "install-go-echo: go is not installed (scripts/install-deps.sh test)" >&2; exit 1; }
mkdir -p build/tools
(cd tests/frameworks/go && go build -o ../../../"$out" .)
