"""Fixtures for the integration tests: real binaries on free loopback ports.

The build to test is chosen with --build DIR (default build/release): the tests start
DIR/bin/spindle and DIR/bin/http_test_server, and stop them by PID.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# bench/ holds the helpers the tests share with the benchmarks (ports.py).
sys.path.insert(0, os.path.join(ROOT, "bench"))


def pytest_addoption(parser):
    parser.addoption("--build", default=os.path.join(ROOT, "build", "release"),
                     help="build directory whose bin/ holds the binaries under test")


# The suite's markers, all of them: `make check` (scripts/check.sh) runs `-m "not exclusive"`
# over several worker processes; `make test` runs everything, one test at a time.
MARKERS = {
    "exclusive": "needs the machine to itself (load, soak, valgrind, the package, systemd, "
                 "timings or memory figures that other work on the machine would spoil): "
                 "run by make test only",
}


# Sanitizer reports of every process the tests start (spindle, the test servers, tfb, ...) go to
# files here, whatever the test does with the process's output: a server that an ASan or UBSan
# report aborted (or whose exit found a leak) fails the test that ran it, not only a test that
# happens to look at its exit. A test that sets its own *SAN_OPTIONS keeps this (see san_env).
SANITIZER_LOGS = tempfile.mkdtemp(prefix="spindle-sanitizer-")
SANITIZER_VARS = ("ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS")


def san_env(options=""):
    """`options` (colon-separated) for a sanitizer's *_OPTIONS, with the suite's log_path kept."""
    where = f"log_path={SANITIZER_LOGS}/report"
    return f"{options}:{where}" if options else where


for _var in SANITIZER_VARS:
    os.environ[_var] = san_env(os.environ.get(_var, ""))


def sanitizer_reports_since(seen):
    """The sanitizer report files written since `seen` (a set of names), with their text."""
    found = []
    for name in sorted(set(os.listdir(SANITIZER_LOGS)) - seen):
        with open(os.path.join(SANITIZER_LOGS, name), errors="replace") as f:
            found.append((name, f.read()))
    return found


SANITIZER_REPORTS_SEEN = set()
SANITIZER_REPORTS_BETWEEN_TESTS = []  # written while no test ran: a module-scoped server's exit


def sanitizer_failure(reports, whose):
    text = "\n".join(f"== {name}\n{body[:6000]}" for name, body in reports)
    pytest.fail(f"{len(reports)} sanitizer report(s) from {whose}:\n{text}", pytrace=False)


def take_sanitizer_reports():
    reports = sanitizer_reports_since(SANITIZER_REPORTS_SEEN)
    SANITIZER_REPORTS_SEEN.update(name for name, _ in reports)
    return reports


@pytest.fixture(scope="session", autouse=True)
def no_sanitizer_report_left():
    """Fails the run (as an error of its last test) if a process a module- or session-scoped
    fixture ran wrote a sanitizer report: those stop after their tests' own checks."""
    yield
    reports = SANITIZER_REPORTS_BETWEEN_TESTS + take_sanitizer_reports()
    if reports:
        sanitizer_failure(reports, "processes that outlived a test (module or session fixtures)")


@pytest.fixture(autouse=True)
def no_sanitizer_report(no_sanitizer_report_left):
    """Fails the test if a process it ran wrote a sanitizer report (checked after its other
    function-scoped fixtures stopped their processes)."""
    SANITIZER_REPORTS_BETWEEN_TESTS.extend(take_sanitizer_reports())
    yield
    reports = take_sanitizer_reports()
    if reports:
        sanitizer_failure(reports, "processes this test ran")


def pytest_configure(config):
    for name, why in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {why}")
    config.option.strict_markers = True  # a misspelt marker is an error, not a new marker


class Server:
    """A started server process and the address it listens on."""

    def __init__(self, argv, env=None):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=None if env is None else {**os.environ, **env})
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read()
            raise RuntimeError(f"{argv[0]} exited before listening: {err}")
        event = json.loads(line)
        host, port = event["address"].rsplit(":", 1)
        self.host, self.port = host, int(port)
        # Keep reading its output (access log lines), so that a full pipe never stalls it.
        self.output = []
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        # And its log: a full stderr pipe would stall it too.
        self.errors = []
        self.error_reader = threading.Thread(target=self._drain_errors, daemon=True)
        self.error_reader.start()

    def _drain(self):
        for line in self.proc.stdout:
            self.output.append(line)

    def _drain_errors(self):
        for line in self.proc.stderr:
            self.errors.append(line)

    def connect(self, timeout=5.0):
        return Conn(socket.create_connection((self.host, self.port), timeout=timeout))

    def stop(self, sig=signal.SIGTERM, timeout=15):
        """Signals the process and returns its exit code (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


@pytest.fixture(scope="session")
def build_dir(request):
    path = request.config.getoption("--build")
    if not os.path.isdir(os.path.join(path, "bin")):
        pytest.exit(f"no binaries in {path}/bin: build first (make build)", returncode=2)
    return path


def sanitizer_build(build_dir):
    """True if `build_dir` is an ASan or TSan build (valgrind cannot run it; its memory
    figures say nothing about spindle's)."""
    cache = os.path.join(build_dir, "CMakeCache.txt")
    return os.path.exists(cache) and bool(
        re.search(r"CMAKE_BUILD_TYPE:\w+=(Asan|Tsan)", open(cache).read()))


@pytest.fixture
def up(build_dir):
    """A test upstream (http_test_server) for the gateway tests, named "a"."""
    from proxy_support import upstream  # (proxy_support imports this module)
    server = upstream(build_dir, "a")
    yield server
    server.stop()


@pytest.fixture
def stage(build_dir, tmp_path):
    """Starts gateways and upstreams for the test and stops them at its end (proxy_support's
    Stage)."""
    from proxy_support import Stage
    started = Stage(build_dir, tmp_path)
    yield started
    started.stop()


@pytest.fixture
def recorder():
    """A scripted upstream that records every request it receives (proxy_support's
    RecordingUpstream)."""
    from proxy_support import RecordingUpstream
    upstream = RecordingUpstream()
    yield upstream
    upstream.stop()


@pytest.fixture
def test_server(build_dir):
    server = Server([os.path.join(build_dir, "bin", "http_test_server"), "0"])
    yield server
    server.stop()


@pytest.fixture
def spindle(build_dir):
    server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--listen",
                     "127.0.0.1:0", "--threads", "2"])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """The test CA and certificates of tests/tls/make-certs.sh (localhost, *.other.test)."""
    path = str(tmp_path_factory.mktemp("certs"))
    subprocess.run([os.path.join(ROOT, "tests", "tls", "make-certs.sh"), path], check=True)
    return path


@pytest.fixture
def tls_site(build_dir, certs, tmp_path):
    """spindle serving HTTPS (localhost certificate, other.test by SNI) from a config file,
    with a static root holding a 1 MiB file and a 1 s handshake timeout."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "big.bin").write_bytes(bytes(range(256)) * 4096)
    config = tmp_path / "tls.yaml"
    config.write_text(f"""
servers:
  - listen: 127.0.0.1:0
    root: {root}
    default_site: true
    access_log: off
    timeouts: {{handshake: 1s}}
    tls:
      cert: {certs}/localhost.pem
      key: {certs}/localhost.key
      sni:
        - {{cert: {certs}/other.pem, key: {certs}/other.key}}
""")
    server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(config),
                     "--threads", "2"])
    yield server
    server.stop()


class Conn:
    """A client socket that keeps bytes read past one response for the next."""

    def __init__(self, sock):
        self.sock = sock
        self.buffer = b""

    def sendall(self, data):
        self.sock.sendall(data)

    def settimeout(self, t):
        self.sock.settimeout(t)

    def recv_more(self):
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return chunk

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def memory_kib(pid, field="VmRSS", file="status"):
    """A memory figure of process `pid` in KiB, from /proc/PID/`file`: VmRSS (resident now),
    VmHWM (its peak) from status, AnonHugePages from smaps_rollup. The one reader of these."""
    with open(f"/proc/{pid}/{file}") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/{file} has no {field}")


def read_response(conn, head_only=False):
    """Reads one HTTP/1.1 response; returns (status, headers dict lower-cased, body bytes)."""
    while b"\r\n\r\n" not in conn.buffer:
        if not conn.recv_more():
            raise ConnectionError(f"closed before a full head: {conn.buffer!r}")
    head, _, rest = conn.buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head_only or status in (100, 204, 304) else int(headers.get("content-length", 0))
    conn.buffer = rest
    while len(conn.buffer) < length:
        if not conn.recv_more():
            raise ConnectionError("closed inside the body")
    body, conn.buffer = conn.buffer[:length], conn.buffer[length:]
    return status, headers, body


def read_responses(conn, count):
    """Reads `count` pipelined responses in order."""
    return [read_response(conn) for _ in range(count)]


def closed_by_peer(conn, wait=5.0):
    """True if the peer closes the connection within `wait` seconds."""
    conn.settimeout(wait)
    try:
        while True:
            if not conn.sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


@pytest.fixture
def http():
    """Helpers for raw HTTP over sockets."""
    class Helpers:
        read_response = staticmethod(read_response)
        read_responses = staticmethod(read_responses)
        closed_by_peer = staticmethod(closed_by_peer)
    return Helpers


@pytest.fixture
def shared(build_dir, tmp_path):
    """h2_traffic.Shared: a gateway whose one h2c upstream connection carries a victim's
    download while the test runs; the test calls check_victim()."""
    from h2_traffic import Shared  # h2_traffic imports proxy_support, which imports conftest
    s = Shared(build_dir, tmp_path)
    yield s
    s.stop()


@pytest.fixture
def dns():
    """dns_server.DnsServer, stopped at the test's end."""
    from dns_server import DnsServer  # dns_server imports proxy_support, which imports conftest
    server = DnsServer()
    yield server
    server.stop()
