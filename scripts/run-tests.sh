#!/usr/bin/env bash
# The whole suite: format check, then every test in the release and asan builds, then the
# cross-worker tests under ThreadSanitizer. Fails if any test fails or if no test ran.
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
scripts/prepare-test-host.sh
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

total_pass=0
total_fail=0
failed_runs=()

# ctest in build/$1 with extra ctest arguments; adds its counts to the totals.
run_ctest() {
  local config=$1; shift
  local log=build/$config/ctest.log
  echo "== ctest ($config) =="
  (cd "build/$config" && ctest --output-on-failure -j "$jobs" "$@") 2>&1 | tee "$log" | grep -aE '\*\*\*(Failed|Timeout|Exception)|Not Run|tests passed|Total Test time'
  local summary passed failed ran
  summary=$(grep -aE 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1)
  if [ -z "$summary" ]; then
    echo "run-tests: ctest ($config) printed no summary: treated as a failure"
    failed_runs+=("$config:no-summary"); return
  fi
  failed=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$summary")
  ran=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$summary")
  passed=$((ran - failed))
  total_pass=$((total_pass + passed))
  total_fail=$((total_fail + failed))
  if [ "$ran" -eq 0 ]; then failed_runs+=("$config:no-tests"); fi
  if [ "$failed" -ne 0 ]; then failed_runs+=("$config"); fi
}

# pytest integration suite against build/$1; adds its counts to the totals.
run_pytest() {
  local config=$1
  local log=build/$config/pytest.log
  echo "== pytest ($config) =="
  /usr/bin/python3 -m pytest tests/integration -q -p no:cacheprovider --build "build/$config" \
    2>&1 | tee "$log" | tail -n 15
  local code=${PIPESTATUS[0]}
  local passed failed
  passed=$(grep -aoE '[0-9]+ passed' "$log" | tail -1 | cut -d' ' -f1)
  failed=$(grep -aoE '[0-9]+ (failed|error)' "$log" | awk '{s+=$1} END {print s+0}')
  total_pass=$((total_pass + ${passed:-0}))
  total_fail=$((total_fail + failed))
  # Exit code 5 is pytest's "no tests collected": never a success.
  if [ "$code" -eq 5 ] || [ -z "$passed" ]; then failed_runs+=("$config:pytest-no-tests"); return; fi
  if [ "$code" -ne 0 ]; then failed_runs+=("$config:pytest"); fi
}

if ! scripts/check-format.sh; then failed_runs+=("format"); fi
# The HTTP/2 conformance suite the integration tests run (a failure here fails them).
scripts/install-h2spec.sh || echo "run-tests: could not build h2spec: the h2spec tests will fail"

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
tsan_targets="unit_fiber unit_sync unit_net unit_pg unit_hook"
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
else
  failed_runs+=("tsan:build")
fi

echo
echo "run-tests: $total_pass passed, $total_fail failed"
if [ ${#failed_runs[@]} -ne 0 ]; then
  echo "run-tests: FAILED: ${failed_runs[*]}"
  exit 1
fi
if [ "$total_pass" -eq 0 ]; then
  echo "run-tests: no test ran: FAILED"
  exit 1
fi
echo "$total_pass passed, $total_fail failed"
