#!/usr/bin/env bash
# Builds the HTTP/2 conformance suite h2spec into build/tools/ with the Go toolchain, once,
# at the versions pinned in tests/tools/go.mod (go.sum checks what the proxy serves). The
# tests look for build/tools/h2spec.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tools/h2spec ] && exit 0
command -v go >/dev/null || { echo "install-h2spec: go is not installed (make test installs golang-go)" >&2; exit 1; }
mkdir -p build/tools
echo "install-h2spec: building h2spec v2.2.1 (tests/tools/go.mod)"
(cd tests/tools && go build -o ../../build/tools/h2spec github.com/summerwind/h2spec/cmd/h2spec)
