"""The soak through the proxy, short: 10,000 client connections for 30 s through a route with a
typical middleware chain (bench/soak_proxy.py; `make soak` runs it for 3 minutes). Zero socket
errors, zero non-2xx answers, RSS flat after the warm-up, descriptors back after the load."""
import os
import resource
import shutil
import subprocess

import pytest

from conftest import sanitizer_build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONNECTIONS = 10_000


def test_ten_thousand_connections_through_the_proxy(build_dir, tmp_path):
    if sanitizer_build(build_dir):
        pytest.skip("the soak runs against the release build (a sanitizer build's memory says "
                    "nothing about spindle's)")
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (scripts/install-deps.sh test installs it)")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < CONNECTIONS + 1_000:
        pytest.fail(f"the soak needs `ulimit -n` of at least {CONNECTIONS + 1_000} (10,000 client "
                    f"connections); the hard limit here is {hard}: raise it")
    out = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "soak_proxy.py"),
                          "--build", build_dir, "--connections", str(CONNECTIONS),
                          "--seconds", "30", "--out", str(tmp_path / "soak.json")],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "soak: PASS" in out.stdout, out.stdout[-4000:] + out.stderr
    import json
    result = json.loads((tmp_path / "soak.json").read_text())
    assert result["socket_errors"] == 0 and result["non2xx"] == 0
    assert result["requests"] > 50_000, result["requests"]
    assert result["rss_growth"] <= 0.10
