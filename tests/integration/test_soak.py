"""The soak through the proxy, short: 10,000 client connections for 30 s through a route with a
typical middleware chain (bench/soak_proxy.py; `make soak` runs it for 3 minutes), and the same
over HTTP/2 with TLS both ways. Zero socket errors, zero non-2xx answers, RSS flat after the
warm-up, descriptors back after the load."""
import json
import os
import resource
import shutil
import subprocess

import pytest

from conftest import sanitizer_build

# Thousands of connections for half a minute: the machine to itself (make test only).
pytestmark = pytest.mark.exclusive

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONNECTIONS = 10_000


def soak(build_dir, tmp_path, tools, connections, args):
    """Runs bench/soak_proxy.py with `args`; returns its results once it has passed."""
    if sanitizer_build(build_dir):
        pytest.skip("the soak runs against the release build (a sanitizer build's memory says "
                    "nothing about spindle's)")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (scripts/install-deps.sh test installs it)")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < connections + 1_000:
        pytest.fail(f"the soak needs `ulimit -n` of at least {connections + 1_000} ({connections:,} "
                    f"client connections); the hard limit here is {hard}: raise it")
    out = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "soak_proxy.py"),
                          "--build", build_dir, "--connections", str(connections),
                          "--out", str(tmp_path / "soak.json")] + args,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "soak: PASS" in out.stdout, out.stdout[-4000:] + out.stderr
    result = json.loads((tmp_path / "soak.json").read_text())
    assert result["socket_errors"] == 0 and result["non2xx"] == 0
    assert result["rss_growth"] <= 0.10
    return result


def test_ten_thousand_connections_through_the_proxy(build_dir, tmp_path):
    result = soak(build_dir, tmp_path, ("wrk", "nginx"), CONNECTIONS, ["--seconds", "30"])
    assert result["requests"] > 50_000, result["requests"]


def test_http2_with_tls_both_ways_through_the_proxy(build_dir, tmp_path):
    # spindle's own HTTP/2 code on both sides (server session, HPACK both ways, the upstream
    # client's session), two thousand TLS clients with two streams each.
    result = soak(build_dir, tmp_path, ("h2load", "nginx"), 2_000,
                  ["--protocol", "h2", "--streams", "2", "--seconds", "20"])
    assert result["protocol"] == "h2"
    assert result["requests"] > 50_000, result["requests"]
