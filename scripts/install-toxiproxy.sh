#!/usr/bin/env bash
# Builds Toxiproxy's server (Shopify's fault-injection TCP proxy) into build/tools/ with the Go
# toolchain, once, at the versions pinned in tests/tools/toxiproxy/go.mod (go.sum checks what
# the proxy serves). The fault tests look for build/tools/toxiproxy-server and run this script
# when it is missing (tests/testing/toxiproxy.h, tests/integration/toxiproxy.py); test
# processes that start together wait for one build (flock).
#
# Exit 3 (and a line on stderr) when Go is not installed: the tests that need Toxiproxy skip,
# saying so. Any other failure is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/tools/toxiproxy-server
[ -x "$out" ] && exit 0
command -v go >/dev/null || {
  echo "install-toxiproxy: go is not installed (make test installs golang-go)" >&2
  exit 3
}
mkdir -p build/tools
exec 9>build/tools/.toxiproxy.lock
flock 9
[ -x "$out" ] && exit 0  # built by another process meanwhile
echo "install-toxiproxy: building toxiproxy-server v2.9.0 (tests/tools/toxiproxy/go.mod)" >&2
(cd tests/tools/toxiproxy &&
  go build -o "../../../$out.tmp.$$" github.com/Shopify/toxiproxy/v2/cmd/server)
mv "$out.tmp.$$" "$out"
