"""HTTP/2 conformance of spindle's own protocol code alone (h2/: frames, HPACK and the server
session, no libnghttp2): h2spec --strict against tests/integration/h2_session_server.cc, and
h2load's many streams through it. The nghttp2 driver's own run is in test_http2.py."""
import os
import shutil
import subprocess

import pytest

from conftest import Server
from test_http2 import h2spec


@pytest.fixture
def session_server(build_dir):
    server = Server([os.path.join(build_dir, "bin", "h2_session_server"), "0"])
    yield server
    server.stop()


def test_h2spec_strict_passes_every_case_on_the_session(session_server):
    total, passed, skipped, failed, out = h2spec(session_server)
    print(f"h2spec --strict on h2/session: {passed}/{total} passed")
    assert total >= 146 and failed == 0 and skipped == 0 and passed == total, out[-3000:]


def test_many_streams_on_many_connections_all_answered(session_server):
    if shutil.which("h2load") is None:
        pytest.skip("h2load is not installed (apt-get install nghttp2-client)")
    out = subprocess.run(["h2load", "-n", "20000", "-c", "20", "-m", "50",
                          f"http://{session_server.host}:{session_server.port}/"],
                         capture_output=True, text=True, timeout=300)
    assert "20000 succeeded, 0 failed, 0 errored" in out.stdout, out.stdout[-2000:]
    assert "status codes: 20000 2xx" in out.stdout, out.stdout[-2000:]
