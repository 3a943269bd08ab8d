#!/usr/bin/env bash
# make check: the fast loop. The format check and the release build, then ctest and the pytest
# suite side by side, pytest spread over worker processes (pytest-xdist). Leaves to make test
# the sanitizer builds and the tests marked `exclusive` (soak, valgrind, the package, systemd:
# tests that need the machine to themselves; tests/integration/conftest.py lists the marker).
# Fails if any test fails or if no test ran. PYTEST_WORKERS sets the workers (default: twice the
# cores, since most tests wait on sockets and timers).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/prepare-test-host.sh
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

source scripts/test-lib.sh
workers=${PYTEST_WORKERS:-$((2 * jobs))}

if ! scripts/check-format.sh; then failed_runs+=("format"); fi
scripts/install-h2spec.sh || echo "check: could not build h2spec: the h2spec tests will fail"
# The framework upstreams of test_framework_upstreams.py: Express (npm registry) and Go net/http.
scripts/install-express.sh || echo "check: could not install Express: the framework tests will fail"
scripts/install-go-echo.sh || echo "check: could not build the Go server: the framework tests will fail"

echo "== build (release) =="
if ! scripts/build.sh release >build-release.log 2>&1 && ! scripts/build.sh release; then
  failed_runs+=("release:build")
  report_totals
  exit 1
fi
rm -f build-release.log

echo "== ctest and pytest (release, $workers pytest workers) =="
pytest_run release -n "$workers" -m "not exclusive" &
pytest_pid=$!
ctest_run release
wait "$pytest_pid"
echo "== ctest (release) =="
ctest_count release
echo "== pytest (release) =="
pytest_count release
report_totals
