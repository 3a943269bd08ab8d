"""A gateway's HTTP/2 connection to a real upstream (nghttp2's nghttpd, h2o) goes from idle to
a burst of several hundred requests at once, four in ten of them given up by their clients
(resets right after the head and once the answer began, closed HTTP/1.1 connections): no
connection is lost, and every request not given up gets its whole answer (issue 68)."""
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from h2_traffic import CountingRelay, failures, run_clients, wait_listening
from proxy_support import free_port, gateway, request

SIZES = [0, 1000, 16384, 65536, 100000, 300000]


@pytest.fixture
def docroot():
    """A document root readable by h2o's unprivileged workers: a file of each size."""
    root = tempfile.mkdtemp(prefix="spindle-h2-peer-")
    os.chmod(root, 0o755)
    for n in SIZES:
        with open(os.path.join(root, f"f{n}.bin"), "wb") as f:
            f.write(b"p" * n)
        os.chmod(os.path.join(root, f"f{n}.bin"), 0o644)
    yield root
    shutil.rmtree(root)


def start_peer(which, root, tmp_path):
    """nghttpd or h2o serving `root` in h2c on a free port: (process, port)."""
    if not shutil.which({"nghttpd": "nghttpd", "h2o": "h2o"}[which]):
        pytest.fail(f"{which} is not installed (scripts/install-deps.sh test installs it)")
    port = free_port()
    if which == "nghttpd":
        argv = ["nghttpd", "--no-tls", "-d", root, str(port)]
    else:
        conf = tmp_path / "h2o.conf"
        conf.write_text(f"""num-threads: 1
listen:
  host: 127.0.0.1
  port: {port}
hosts:
  default:
    paths:
      /:
        file.dir: {root}
""")
        argv = ["h2o", "-c", str(conf)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(proc, port)
    return proc, port


def stop_peer(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("peer", ["nghttpd", "h2o"])
def test_an_idle_upstream_connection_takes_a_burst_of_cancelling_clients(build_dir, tmp_path,
                                                                        docroot, peer):
    proc, port = start_peer(peer, docroot, tmp_path)
    relay = CountingRelay(port)
    gw = gateway(build_dir, tmp_path, f"""
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: off
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{upstream: pool, protocol: h2c}}
upstreams:
  pool:
    targets: [{{address: "127.0.0.1:{relay.port}"}}]
    limits: {{max_connections: 1}}
""", threads=1)
    try:
        status, _, body = request(gw, "GET", "/f1000.bin")
        assert (status, len(body)) == (200, 1000)
        rng = random.Random(68)
        for burst in range(2):
            time.sleep(1.5)  # the connection idles
            outcomes = run_clients(gw.port, rng, h2_clients=40, streams_each=8, h1_clients=50,
                                   path_of=lambda n: f"/f{n}.bin", sizes=SIZES)
            assert failures(outcomes) == [], f"{peer}, burst {burst}"
            assert sum(not r.kept() for r in outcomes) > 100
        assert relay.accepted == 1, peer
        assert relay.closed == 0, peer
    finally:
        gw.stop()
        relay.stop()
        stop_peer(proc)
