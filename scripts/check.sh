#!/usr/bin/env bash
# make check: the fast loop. The format check and the release build, then ctest and the pytest
# suite side by side, pytest spread over worker processes (pytest-xdist). Leaves to make test
# the sanitizer builds and the tests marked `exclusive` (soak, valgrind, the package, systemd:
# tests that need the machine to themselves; tests/integration/conftest.py lists the marker).
# Fails if any test fails or if no test ran. PYTEST_WORKERS sets the workers (default: four times
# the cores: most tests wait on sockets, timers and timeouts, not on the CPU). The pytest log
# (build/release/pytest.log) ends with the 25 slowest tests; ctest's (build/release/ctest.log)
# gives each test's time.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/prepare-test-host.sh
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

source scripts/test-lib.sh
workers=${PYTEST_WORKERS:-$((4 * jobs))}

if ! scripts/check-format.sh; then failed_runs+=("format"); fi
scripts/install-h2spec.sh || echo "check: could not build h2spec: the h2spec tests will fail"
# The framework upstreams of test_framework_upstreams.py: Express (npm registry) and Go net/http.
scripts/install-express.sh || echo "check: could not install Express: the framework tests will fail"
scripts/install-go-echo.sh || echo "check: could not build the Go server: the framework tests will fail"

prepared=$SECONDS
echo "== build (release) =="
if ! scripts/build.sh release >build-release.log 2>&1 && ! scripts/build.sh release; then
  failed_runs+=("release:build")
  report_totals
  exit 1
fi
rm -f build-release.log
built=$SECONDS

echo "== ctest and pytest (release, $workers pytest workers) =="
pytest_run release -n "$workers" -m "not exclusive" --durations=25 &
pytest_pid=$!
ctest_run release
ctest_done=$SECONDS
wait "$pytest_pid"
# Where the time went: the phase to shorten first is the longest.
echo "check: format and tools $prepared s, build $((built - prepared)) s, ctest" \
  "$((ctest_done - built)) s; ctest and pytest (side by side) done after $((SECONDS - built)) s"
echo "== ctest (release) =="
ctest_count release
echo "== pytest (release) =="
pytest_count release
report_totals
