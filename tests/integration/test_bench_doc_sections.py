"""docs/benchmarks.md is written by the tools that measure (`make bench`: bench/report.py,
`make goals`: bench/goals_chart.py, `make soak`: bench/soak_proxy.py), each replacing its own
section between its markers (bench/doc_sections.py): a run brings the page up to date and
leaves the other tools' sections and the hand-kept intro as they were, and never adds a
second, dated copy of itself."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from doc_sections import write_section  # noqa: E402

PY = "/usr/bin/python3"
INTRO = "# Benchmarks\n\nThe intro, kept by hand.\n"
OTHER = ("<!-- make goals: begin (written by bench/goals_chart.py; edits here are lost) -->\n"
         "## goals\n\n| a | b |\n<!-- make goals: end -->\n")
TAIL = "\nA closing line.\n"


def page_with(section_lines, tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text(INTRO + "\n" + OTHER)
    write_section(str(path), "make bench", "bench/report.py", section_lines)
    with open(path, "a") as f:
        f.write(TAIL)
    return path


def test_a_section_is_replaced_where_it_stands_and_the_rest_of_the_page_kept(tmp_path):
    path = page_with(["## make bench", "", "old figures"], tmp_path)
    before = path.read_text()
    head = before.split("<!-- make bench: begin")[0]
    tail = before.split("<!-- make bench: end -->")[1]
    for figures in ("new figures", "newer figures, a longer line than the others"):
        write_section(str(path), "make bench", "bench/report.py", ["## make bench", "", figures])
        after = path.read_text()
        assert after.startswith(head) and after.endswith(tail)
        assert figures in after and "old figures" not in after
        assert after.count("<!-- make bench: begin") == 1 and after.count("make bench: end") == 1
        assert after.count(OTHER) == 1
    # The same figures again change nothing.
    write_section(str(path), "make bench", "bench/report.py", ["## make bench", "", figures])
    assert path.read_text() == after


def test_a_page_without_the_section_gets_it_once_at_its_end(tmp_path):
    path = tmp_path / "docs" / "new.md"
    write_section(str(path), "make soak, HTTP/1.1", "bench/soak_proxy.py", ["## soak", "one"])
    write_section(str(path), "make soak, HTTP/2", "bench/soak_proxy.py", ["## soak h2", "two"])
    write_section(str(path), "make soak, HTTP/1.1", "bench/soak_proxy.py", ["## soak", "three"])
    text = path.read_text()
    assert text.count("make soak, HTTP/1.1: begin") == 1 and "one" not in text
    assert text.index("three") < text.index("two")  # replaced where it stood, not moved
    assert text.startswith("<!-- make soak, HTTP/1.1: begin") and text.endswith("end -->\n")


@pytest.mark.parametrize("broken", [
    "<!-- make bench: begin (x) -->\nno end\n",
    "<!-- make bench: begin (x) -->\na\n<!-- make bench: end -->\n"
    "<!-- make bench: begin (x) -->\nb\n<!-- make bench: end -->\n",
    "<!-- make bench: end -->\n<!-- make bench: begin (x) -->\n",
])
def test_a_page_whose_markers_cannot_be_trusted_is_not_rewritten(tmp_path, broken):
    path = tmp_path / "benchmarks.md"
    path.write_text(INTRO + broken)
    with pytest.raises(ValueError):
        write_section(str(path), "make bench", "bench/report.py", ["## new"])
    assert path.read_text() == INTRO + broken


def micro_and_echo(tmp_path):
    names = ["Switch", "SpawnJoin", "ChannelPingPong", "MutexUncontended", "TimerInsertCancel"]
    peer = {n: "ucontext" if n == "Switch" else "pthread" for n in names}
    benchmarks = [{"run_name": f"BM_{n}_{side}", "aggregate_name": "median", "time_unit": "ns",
                   "real_time": 10.0 if side == "spindle" else 200.0}
                  for n in names for side in ("spindle", peer[n])]
    micro = tmp_path / "micro.json"
    micro.write_text(json.dumps({"context": {"num_cpus": 2, "mhz_per_cpu": 2445},
                                 "benchmarks": benchmarks}))
    side = {"messages_per_second": 100000.0, "server_cpu_us_per_message": 9.0, "errors": 0}
    echo = tmp_path / "echo.json"
    echo.write_text(json.dumps({"seconds": 4, "rounds": 3, "cases": [
        {"connections": 100, "bytes": 64, "spindle": side, "epoll": side,
         "throughput_ratio": 1.0, "cpu_ratio": 1.0}]}))
    return micro, echo


def test_make_bench_replaces_its_section_and_keeps_the_goals_and_the_intro(tmp_path):
    pytest.importorskip("matplotlib")
    micro, echo = micro_and_echo(tmp_path)
    path = tmp_path / "benchmarks.md"
    path.write_text(INTRO + "\n" + OTHER)
    loads = tmp_path / "hard_loads.json"
    loads.write_text(json.dumps({"seconds": 5, "rounds": 3, "results": [
        {"gateway": gateway, "workload": "1 MB upload", "connections": 50, "rps": rps,
         "cpu_us_per_request": cpu, "peak_rss_mb": 14.2, "errors": 0}
        for gateway, rps, cpu in (("spindle", 1208.0, 632.0), ("nginx", 426.0, 2318.0))]}))
    for _ in range(2):
        out = subprocess.run([PY, os.path.join(ROOT, "bench", "report.py"), "--micro", str(micro),
                              "--echo", str(echo), "--markdown", str(path),
                              "--chart", str(tmp_path / "benchmarks.png"),
                              "--hard-loads", str(loads),
                              "--hard-loads-chart", str(tmp_path / "benchmarks-hard-loads.png")],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        text = path.read_text()
        assert text.startswith(INTRO) and text.count(OTHER) == 1
        assert text.count("<!-- make bench: begin") == 1
        assert text.count("### Runtime micro-benchmarks") == 1  # one level under `make bench`
        switch = "| fiber switch (yield ping-pong) | 10.0 ns | swapcontext | 200.0 ns | 20.0x |"
        assert switch in text
        assert "![benchmarks](benchmarks.png)" in text
        # spindle's CPU over each peer's: 632 / 2,318 µs a request
        assert "| 1 MB upload | nginx | 426 | 2318.0 | 0.27x | 14 | 0 |" in text
        assert "### The gateway under hard loads" in text


def proxy_results(tmp_path, spindle, haproxy):
    results = [{"server": server, "setup": "h2tls->h2", "connections": 100,
                "round_cpu_us": rounds} for server, rounds in (("spindle", spindle),
                                                               ("haproxy", haproxy))]
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps({"results": results}))
    return path


def test_make_goals_writes_its_verdicts_as_its_section_and_replaces_them(tmp_path):
    pytest.importorskip("matplotlib")
    page = tmp_path / "benchmarks.md"
    page.write_text(INTRO)
    cases = [([9.0] * 6, [10.0] * 6, "0.90x", "met"),         # at most haproxy's cost: met
             ([12.0] * 6, [10.0] * 6, "1.20x", "not met"),
             ([9.0, 11.0] * 3, [10.0] * 6, "1.00x", "within the noise")]
    for spindle, haproxy, ratio, verdict in cases:
        out = subprocess.run([PY, os.path.join(ROOT, "bench", "goals_chart.py"),
                              "--proxy", str(proxy_results(tmp_path, spindle, haproxy)),
                              "--out", str(tmp_path / "goals.png"), "--markdown", str(page),
                              "--command", "bench/goals.sh 6"],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        text = page.read_text()
        assert text.startswith(INTRO) and text.count("<!-- make goals: begin") == 1
        row = next(line for line in text.splitlines() if line.startswith("| h2tls->h2 c100"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == ratio and cells[3] == "6" and cells[4] == "≤ 1.0x", row
        assert cells[5] == verdict, row
        assert "`bench/goals.sh 6`" in text and "![Issue 24's goals](goals.png)" in text


def test_make_soak_section_says_what_the_verdict_rests_on():
    import soak_proxy
    samples = [{"t": t, "rss_kib": 400 * 1024, "fds": 11 if t == 0 else 12060} for t in range(8)]
    result = {"protocol": "h1", "connections": 10000, "streams": 1, "seconds": 180,
              "requests": 3867641, "socket_errors": 0, "non2xx": 0,
              "rss_warmup_peak_kib": 474 * 1024, "rss_peak_kib": 506 * 1024,
              "rss_growth": 506 / 474 - 1, "idle_fds": 11, "fds_after": 1535, "samples": samples}
    lines = soak_proxy.section(result, "docs/benchmarks-soak.png", "docs/benchmarks.md",
                               "bench/soak_proxy.py --seconds 180")
    text = "\n".join(lines)
    assert ("| 3,867,641 (21,487/s) | 0 | 0 | 474 MiB | 506 MiB (+6.8%) | 52 KiB | "
            "11 / 12,060 / 1,535 |") in text
    assert "![RSS and descriptors over the soak](benchmarks-soak.png)" in text
    assert "`bench/soak_proxy.py --seconds 180`" in text
