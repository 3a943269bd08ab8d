"""bench/inflight_chart.py's table: each gateway's figures at each load, spindle's ratio to each
peer at the same load (not another load's, not the other way round)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from inflight_chart import table  # noqa: E402


def result(server, setup, connections, cpu, user):
    return {"server": server, "setup": setup, "connections": connections,
            "cpu_us_per_request": cpu, "user_us_per_request": user}


def test_each_load_is_a_line_with_spindles_ratio_to_each_peer_at_that_load():
    results = [
        result("haproxy", "h2tls->h1", 100, 20.0, 10.0),
        result("spindle", "h2tls->h1", 100, 16.0, 9.0),
        result("h2o", "h2tls->h1", 100, 32.0, 6.0),
        result("spindle", "h2tls->h1", 10, 12.0, 4.0),
        result("haproxy", "h2tls->h1", 10, 10.0, 5.0),
        result("spindle", "h2tls->h2", 10, 9.0, 6.0),
        result("haproxy", "h2tls->h2", 10, 12.0, 6.5),
    ]
    assert table(results) == [
        "h2tls->h1: CPU a request in µs (user), spindle's ratio",
        "    100 in flight: spindle 12.00 (4.00), haproxy 10.00 (5.00) 1.20x",
        "   1000 in flight: spindle 16.00 (9.00), h2o 32.00 (6.00) 0.50x,"
        " haproxy 20.00 (10.00) 0.80x",
        "h2tls->h2: CPU a request in µs (user), spindle's ratio",
        "    100 in flight: spindle 9.00 (6.00), haproxy 12.00 (6.50) 0.75x",
    ]


def test_a_load_spindle_missed_shows_the_peers_without_a_ratio():
    results = [result("haproxy", "h2tls->h1", 500, 40.0, 20.0),
               result("spindle", "h2tls->h1", 100, 16.0, 9.0)]
    assert table(results)[2] == "   5000 in flight: haproxy 40.00 (20.00)"
