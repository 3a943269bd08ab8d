# Sourced by scripts/run-tests.sh (make test) and scripts/check.sh (make check): one way to run
# ctest and pytest and to count what they report. Totals in total_pass and total_fail; what
# failed (or reported nothing) in failed_runs. No test run, or a run without a summary, fails.
jobs=${jobs:-$(nproc)}
total_pass=0
total_fail=0
failed_runs=()

# ctest in build/$1 with extra ctest arguments, its output in build/$1/ctest.log.
ctest_run() {
  local config=$1; shift
  (cd "build/$config" && ctest --output-on-failure -j "$jobs" "$@") >"build/$config/ctest.log" 2>&1
}

# Adds ctest's counts (from build/$1/ctest.log) to the totals; $2 names the run.
ctest_count() {
  local config=$1 name=${2:-$1}
  local log=build/$config/ctest.log
  grep -aE '\*\*\*(Failed|Timeout|Exception)|Not Run|tests passed|Total Test time' "$log"
  local summary failed ran
  summary=$(grep -aE 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1)
  if [ -z "$summary" ]; then
    echo "run-tests: ctest ($name) printed no summary: treated as a failure"
    failed_runs+=("$name:no-summary"); return
  fi
  failed=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$summary")
  ran=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$summary")
  total_pass=$((total_pass + ran - failed))
  total_fail=$((total_fail + failed))
  if [ "$ran" -eq 0 ]; then failed_runs+=("$name:no-tests"); fi
  if [ "$failed" -ne 0 ]; then failed_runs+=("$name"); fi
}

# ctest in build/$1 with extra ctest arguments, shown and counted.
run_ctest() {
  echo "== ctest ($1) =="
  ctest_run "$@"
  ctest_count "$1"
}

# The pytest integration suite against build/$1 with extra pytest arguments; its output in
# build/$1/pytest.log, its exit status in build/$1/pytest.status.
pytest_run() {
  local config=$1; shift
  /usr/bin/python3 -m pytest tests/integration -q -p no:cacheprovider --build "build/$config" \
    "$@" >"build/$config/pytest.log" 2>&1
  echo $? >"build/$config/pytest.status"
}

# Adds pytest's counts (its last summary line, in build/$1/pytest.log) to the totals.
pytest_count() {
  local config=$1 name=${2:-$1}
  local log=build/$config/pytest.log
  local code summary passed failed
  code=$(cat "build/$config/pytest.status" 2>/dev/null || echo 1)
  tail -n 15 "$log"
  local outcomes='passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?'
  summary=$(grep -aE "^=* ?[0-9]+ ($outcomes).* in [0-9.]+s" "$log" | tail -1)
  passed=$(grep -oE '[0-9]+ passed' <<<"$summary" | cut -d' ' -f1)
  failed=$(grep -oE '[0-9]+ (failed|errors?)' <<<"$summary" | awk '{s+=$1} END {print s+0}')
  total_pass=$((total_pass + ${passed:-0}))
  total_fail=$((total_fail + failed))
  # Exit code 5 is pytest's "no tests collected": never a success; nor is a run that passed
  # nothing, whatever its exit code, nor a non-zero exit whatever its counts.
  if [ "$code" -eq 5 ] || [ -z "$passed" ]; then failed_runs+=("$name:pytest-no-tests"); return; fi
  if [ "$code" -ne 0 ]; then failed_runs+=("$name:pytest"); fi
}

# The pytest suite against build/$1 with extra pytest arguments, shown and counted.
run_pytest() {
  echo "== pytest ($1) =="
  pytest_run "$@"
  pytest_count "$1"
}

# The totals line, and the exit status: 1 if a run failed or no test passed at all.
report_totals() {
  echo
  echo "run-tests: $total_pass passed, $total_fail failed"
  if [ ${#failed_runs[@]} -ne 0 ]; then
    echo "run-tests: FAILED: ${failed_runs[*]}"
    return 1
  fi
  if [ "$total_pass" -eq 0 ]; then
    echo "run-tests: no test ran: FAILED"
    return 1
  fi
  echo "$total_pass passed, $total_fail failed"
}
