"""examples/tfb's start against a database that accepts and never answers (issue 69 item 16):
the start ends by its deadline (--startup-timeout) with a clear message and status 1, and
SIGTERM or SIGINT while it waits stops it at once (status 0). By both roads to PostgreSQL.
"""
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

ROADS = ["native", "hooked"]


class SilentDatabase:
    """A TCP listener on the loopback that accepts connections and never says a word."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.accepted = threading.Event()
        self.held = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)
            self.accepted.set()

    def conninfo(self):
        return f"host=127.0.0.1 port={self.port} dbname=hello_world user=benchmarkdbuser"

    def close(self):
        self.listener.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent():
    db = SilentDatabase()
    yield db
    db.close()


def start(build_dir, conninfo, road, *extra):
    return subprocess.Popen([os.path.join(build_dir, "bin", "tfb"), "--listen", "127.0.0.1:0",
                             "--db", conninfo, "--threads", "1", "--road", road, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended(proc, within):
    """The exit status if `proc` ends within `within` seconds (else it is killed: None)."""
    try:
        return proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


@pytest.mark.parametrize("road", ROADS)
def test_the_start_ends_by_its_deadline(build_dir, silent, road):
    began = time.monotonic()
    proc = start(build_dir, silent.conninfo(), road, "--startup-timeout", "2")
    status = ended(proc, 20)
    took = time.monotonic() - began
    err = proc.stderr.read()
    assert silent.accepted.is_set(), "tfb never connected"
    assert status == 1, f"status {status}: {err}"
    assert "did not answer in time" in err, err
    assert proc.stdout.read() == "", "it listened without the database"
    assert took >= 1.9, f"gave up after {took:.1f} s, before its deadline"


@pytest.mark.parametrize("road", ROADS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_start(build_dir, silent, road, sig):
    proc = start(build_dir, silent.conninfo(), road)  # the default deadline: 30 s
    assert silent.accepted.wait(10), "tfb never connected"
    time.sleep(0.2)  # it waits for the answer now
    signalled = time.monotonic()
    proc.send_signal(sig)
    status = ended(proc, 5)
    took = time.monotonic() - signalled
    err = proc.stderr.read()
    assert status == 0, f"status {status} (None: still running 5 s after the signal): {err}"
    assert f"stopped by signal {int(sig)}" in err, err
    assert took < 2, f"took {took:.1f} s to stop"


@pytest.mark.parametrize("road", ROADS)
def test_a_refused_connection_fails_the_start_at_once(build_dir, road):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    proc = start(build_dir, f"host=127.0.0.1 port={port} dbname=x user=x", road)
    status = ended(proc, 10)
    err = proc.stderr.read()
    assert status == 1, f"status {status}: {err}"
    assert "cannot connect" in err, err
