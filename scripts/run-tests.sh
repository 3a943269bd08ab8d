#!/usr/bin/env bash
# The whole suite: format check, then every test in the release and asan builds, then the
# cross-worker tests under ThreadSanitizer. Fails if any test fails or if no test ran.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/prepare-test-host.sh
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

source scripts/test-lib.sh

if ! scripts/check-format.sh; then failed_runs+=("format"); fi
# The HTTP/2 conformance suite the integration tests run (a failure here fails them).
scripts/install-h2spec.sh || echo "run-tests: could not build h2spec: the h2spec tests will fail"
# The framework upstreams of test_framework_upstreams.py: Express (npm registry) and Go net/http.
scripts/install-express.sh || echo "run-tests: could not install Express: the framework tests will fail"
scripts/install-go-echo.sh || echo "run-tests: could not build the Go server: the framework tests will fail"
scripts/install-go-ws.sh || echo "run-tests: could not build the Go WebSocket server: the RFC 8441 upstream tests will fail"
# The fault-injection proxy the fault tests put between spindle and its peers.
scripts/install-toxiproxy.sh || echo "run-tests: could not build Toxiproxy: the fault tests will fail"

for config in release asan; do
  echo "== build ($config) =="
  if ! scripts/build.sh "$config" >"build-$config.log" 2>&1 && ! scripts/build.sh "$config"; then
    failed_runs+=("$config:build"); continue
  fi
  rm -f "build-$config.log"
  run_ctest "$config"
  run_pytest "$config"
done

echo "== build (tsan) =="
tsan_targets="unit_fiber unit_sync unit_net unit_pg unit_hook unit_proxy"
if scripts/build.sh tsan $tsan_targets >build-tsan.log 2>&1 || scripts/build.sh tsan $tsan_targets; then
  rm -f build-tsan.log
  # The tests where fibers on different workers (and plain threads) wake each other, and the
  # database client (its connects and cancels run on helper threads).
  # The 100k-fiber test and the death test say nothing more under TSan and take long there.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" run_ctest tsan -L 'fiber|sync|net|pg' \
    -E 'HundredThousand|DeathTest|Integration'
  # The hooks where threads meet: a plain thread (or another worker) closing what a fiber
  # uses, numbers reused under it, fork, signals; one run of the differential test, its
  # children under TSan too. Those tests close descriptors under other threads on purpose:
  # the suppressions drop that report, and that one only (tests/unit/hook/tsan.supp).
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/unit/hook/tsan.supp" \
    run_ctest tsan -L hook -R 'HookCloseRace|HookAttack|HookReuse|TheScriptsRunTheSameAsWithLibc1'
  # DNS discovery: its thread, the caller's, and c-ares's callbacks on a name server's answers.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" run_ctest tsan -L proxy -R '^Discovery\.'
else
  failed_runs+=("tsan:build")
fi

report_totals
