"""scripts/test-lib.sh, the counting that make test and make check share: the totals come from
pytest's and ctest's own summary lines, and a run that collected nothing, passed nothing, or
exited non-zero fails whatever its counts say."""
import os
import subprocess

import pytest

from conftest import ROOT

LIB = os.path.join(ROOT, "scripts", "test-lib.sh")


def counted(tmp_path, kind, log, status=0):
    """Runs test-lib.sh's <kind>_count on `log` (and pytest's exit `status`) in a scratch tree:
    (passed, failed, the failed runs, report_totals' exit status)."""
    build = tmp_path / "build" / "x"
    build.mkdir(parents=True, exist_ok=True)
    (build / f"{kind}.log").write_text(log)
    (build / "pytest.status").write_text(f"{status}\n")
    script = (f"source {LIB}; {kind}_count x >/dev/null; report_totals >/dev/null; code=$?; "
              'echo "$total_pass|$total_fail|${failed_runs[*]}|$code"')
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    passed, failed, runs, code = out.stdout.strip().split("|")
    return int(passed), int(failed), runs, int(code)


@pytest.mark.parametrize("log, status, expected", [
    ("....\n4 passed in 1.00s\n", 0, (4, 0, "", 0)),
    ("..F\n= 1 failed, 2 passed, 3 deselected in 2.0s =\n", 1, (2, 1, "x:pytest", 1)),
    ("E\n1 passed, 2 errors in 2.0s\n", 1, (1, 2, "x:pytest", 1)),
    # A test's own output that looks like a summary does not count; the last line does.
    ("E   OSError: 5 failed reads, 7 passed checks\n1 failed, 3 passed in 9.0s\n", 1,
     (3, 1, "x:pytest", 1)),
    # Nothing collected (pytest's exit 5), or every test deselected: never a success.
    ("no tests ran in 0.01s\n", 5, (0, 0, "x:pytest-no-tests", 1)),
    ("355 deselected in 3.0s\n", 5, (0, 0, "x:pytest-no-tests", 1)),
    # Counts that look fine with a non-zero exit (a crash in teardown, an internal error).
    ("3 passed in 1.0s\nINTERNALERROR> boom\n", 3, (3, 0, "x:pytest", 1)),
    # No summary at all (killed): a failure.
    ("....\n", 0, (0, 0, "x:pytest-no-tests", 1)),
])
def test_pytest_runs_are_counted_from_the_summary_and_nothing_is_a_failure(tmp_path, log,
                                                                           status, expected):
    assert counted(tmp_path, "pytest", log, status) == expected


@pytest.mark.parametrize("log, expected", [
    ("100% tests passed, 0 tests failed out of 12\n", (12, 0, "", 0)),
    ("92% tests passed, 1 tests failed out of 12\n", (11, 1, "x", 1)),
    ("No tests were found!!!\n", (0, 0, "x:no-summary", 1)),
    ("100% tests passed, 0 tests failed out of 0\n", (0, 0, "x:no-tests", 1)),
])
def test_ctest_runs_are_counted_from_the_summary_and_nothing_is_a_failure(tmp_path, log,
                                                                          expected):
    assert counted(tmp_path, "ctest", log) == expected
