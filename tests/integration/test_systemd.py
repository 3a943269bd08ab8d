"""spindle under systemd's protocols, without systemd running: the notify protocol against a
NOTIFY_SOCKET the test opens; socket activation from sockets the test holds (a restart under
load refuses nothing) and from Debian's systemd-socket-activate; the unit checked with
systemd-analyze verify; spindle running with what the unit leaves it (a read-only file system,
another user, no new privileges, CAP_NET_BIND_SERVICE alone)."""
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

from conftest import ROOT, Conn, Server, read_response
from proxy_support import free_port

# Units, socket activation, ports below 1024 probed by number: make test only.
pytestmark = pytest.mark.exclusive

UNIT = os.path.join(ROOT, "packaging", "spindle.service")


def spindle_bin(build_dir):
    return os.path.abspath(os.path.join(build_dir, "bin", "spindle"))


class Notifications:
    """A NOTIFY_SOCKET: a datagram socket at a path (or in the abstract namespace, '@...')."""

    def __init__(self, where):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(where if not where.startswith("@") else "\0" + where[1:])
        self.where = where

    def next(self, timeout=20):
        """The next message, as a dict of its KEY=value lines."""
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n") if line)

    def close(self):
        self.sock.close()


def get(port, path="/", timeout=5):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status


@pytest.mark.parametrize("abstract", [False, True])
def test_the_notify_protocol_ready_reloading_stopping(build_dir, tmp_path, abstract):
    where = f"@spindle-test-{os.getpid()}-{time.monotonic_ns()}" if abstract \
        else str(tmp_path / "notify")
    notes = Notifications(where)
    config = tmp_path / "spindle.yaml"
    config.write_text("servers:\n  - listen: 127.0.0.1:0\n    default_site: true\n")
    server = Server([spindle_bin(build_dir), "serve", "--config", str(config), "--threads", "1"],
                    env={"NOTIFY_SOCKET": where})
    try:
        ready = notes.next()
        assert ready["READY"] == "1"
        assert re.fullmatch(r"serving 1 server\(s\), 0 route\(s\), 1 worker\(s\)", ready["STATUS"])
        assert get(server.port) == 200  # READY=1 came once it listens

        before = time.clock_gettime(time.CLOCK_MONOTONIC)
        server.proc.send_signal(signal.SIGHUP)
        reloading = notes.next()
        after = time.clock_gettime(time.CLOCK_MONOTONIC)
        assert reloading["RELOADING"] == "1"
        assert before * 1e6 - 1 <= int(reloading["MONOTONIC_USEC"]) <= after * 1e6 + 1
        again = notes.next()
        assert again["READY"] == "1" and again["STATUS"].startswith("reloaded; serving ")

        # A configuration with an error: refused, and systemd hears the old one still serves.
        # (The file's change may reload it too, before or after SIGHUP: each reload is a
        # RELOADING=1 then a READY=1.)
        config.write_text("servers: [ {listen: nowhere} ]\n")
        server.proc.send_signal(signal.SIGHUP)
        messages = [notes.next(), notes.next()]
        try:
            while True:
                messages.append(notes.next(timeout=2))
        except socket.timeout:
            pass
        assert len(messages) in (2, 4), messages
        for reloading, refused in zip(messages[::2], messages[1::2]):
            assert reloading["RELOADING"] == "1"
            assert refused["READY"] == "1"
            assert refused["STATUS"].startswith("reload rejected; serving 1 server(s)")
        assert get(server.port) == 200

        server.proc.send_signal(signal.SIGTERM)
        stopping = notes.next()
        assert stopping["STOPPING"] == "1"
        assert stopping["STATUS"] == "draining (up to 10000 ms)"
        assert server.stop() == 0
    finally:
        server.stop()
        notes.close()


def test_without_notify_socket_nothing_is_sent_and_a_bad_one_is_said(build_dir):
    server = Server([spindle_bin(build_dir), "serve", "--listen", "127.0.0.1:0", "--threads",
                     "1"], env={"NOTIFY_SOCKET": "not-a-path"})
    try:
        assert get(server.port) == 200
    finally:
        assert server.stop() == 0
    assert any("NOTIFY_SOCKET=not-a-path: not a socket path" in line for line in server.errors)


def listening_socket():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    return s


def activated(build_dir, held, config, *extra_env):
    """spindle started the way systemd starts it: the held socket as descriptor 3,
    LISTEN_FDS=1, LISTEN_FDNAMES, and LISTEN_PID its own PID (set by a shell that execs)."""
    def as_fd_3():
        os.dup2(held.fileno(), 3)
    env = {**os.environ, "LISTEN_FDS": "1", "LISTEN_FDNAMES": "web"}
    return subprocess.Popen(
        ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", spindle_bin(build_dir), "serve",
         "--config", str(config), "--threads", "2"],
        preexec_fn=as_fd_3, pass_fds=[3], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)


def test_socket_activation_a_restart_under_load_refuses_nothing(build_dir, tmp_path):
    held = listening_socket()
    port = held.getsockname()[1]
    config = tmp_path / "spindle.yaml"
    config.write_text(f"servers:\n  - listen: 127.0.0.1:{port}\n    default_site: true\n")
    failures, served, stop = [], [0], threading.Event()

    def load():
        while not stop.is_set():
            try:
                # A new connection each time: in the restart's gap they wait in the backlog.
                assert get(port, "/", timeout=20) == 200
                served[0] += 1
            except Exception as e:  # noqa: BLE001 - every kind of failure counts
                failures.append(repr(e))

    first = activated(build_dir, held, config)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                get(port)
                break
            except OSError:
                time.sleep(0.05)
        workers = [threading.Thread(target=load) for _ in range(4)]
        for w in workers:
            w.start()
        time.sleep(1)
        before = served[0]
        # A client connected just before the stop, its request not sent yet: it is answered.
        early = socket.create_connection(("127.0.0.1", port), timeout=10)
        time.sleep(0.3)  # accepted by the first process
        first.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        early.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = early.recv(65536)
        early.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert b"\r\nConnection: close\r\n" in answer.split(b"\r\n\r\n")[0] + b"\r\n"
        assert first.wait(timeout=30) == 0
        gap_started = time.monotonic()
        time.sleep(0.5)  # nobody accepts for half a second: connection attempts queue
        second = activated(build_dir, held, config)
        time.sleep(1.5)
        stop.set()
        for w in workers:
            w.join(timeout=30)
        assert second.poll() is None, second.stderr.read()
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
        log = second.stderr.read()
    finally:
        stop.set()
        for p in (first,):
            if p.poll() is None:
                p.kill()
        held.close()
    assert failures == [], failures[:5]
    assert served[0] > before > 0
    assert time.monotonic() - gap_started > 0.5
    assert "taking 1 listening socket(s) from systemd" in log
    # The held socket has no SO_REUSEPORT: spindle's second worker could not add its own, said.
    assert "only the 1 inherited listener(s) accept" in log


def test_socket_activation_requests_waiting_before_the_start_are_routed(build_dir, tmp_path):
    # Requests that reached the socket before spindle ran (systemd queues them) are served the
    # moment its listener starts accepting: by then the routes must be in force. (They were
    # published after the listeners started, and the first requests got 404.)
    held = listening_socket()
    port = held.getsockname()[1]
    config = tmp_path / "spindle.yaml"
    config.write_text(
        f"servers:\n  - listen: 127.0.0.1:{port}\n"
        "routes:\n  - name: fixed\n    match: {path_prefix: /}\n"
        "    middlewares: [{respond: {status: 200, body: routed}}]\n    service: never\n"
        "services:\n  never: {url: \"http://127.0.0.1:9\"}\n")  # respond answers first
    clients = []
    for i in range(64):
        c = Conn(socket.create_connection(("127.0.0.1", port), timeout=20))
        c.sendall(f"GET /waiting/{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        clients.append(c)
    proc = activated(build_dir, held, config)
    try:
        answers = [read_response(c) for c in clients]
    finally:
        for c in clients:
            c.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        held.close()
    assert [status for status, _, _ in answers] == [200] * len(clients), answers[:2]
    assert all(body == b"routed" for _, _, body in answers), answers[:2]


def test_a_socket_for_another_process_or_not_listening_is_not_taken(build_dir, tmp_path):
    held = listening_socket()
    port = held.getsockname()[1]
    config = tmp_path / "spindle.yaml"
    config.write_text(f"servers:\n  - listen: 127.0.0.1:{port}\n    default_site: true\n")
    # LISTEN_PID names another process: spindle binds on its own, and fails (the port is held).
    env = {"LISTEN_FDS": "1", "LISTEN_PID": "1"}
    out = subprocess.run([spindle_bin(build_dir), "serve", "--config", str(config)],
                         env={**os.environ, **env}, pass_fds=[held.fileno()],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "cannot listen on" in out.stderr
    held.close()


def test_systemd_socket_activate_starts_spindle_on_its_socket(build_dir, tmp_path):
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        pytest.skip("systemd-socket-activate is not installed (Debian's systemd package)")
    port = free_port()
    config = tmp_path / "spindle.yaml"
    config.write_text(f"servers:\n  - listen: 127.0.0.1:{port}\n    default_site: true\n")
    proc = subprocess.Popen([tool, "-l", f"127.0.0.1:{port}", "--fdname=web",
                             spindle_bin(build_dir), "serve", "--config", str(config),
                             "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # The tool listens at once and starts spindle on the first connection.
        deadline = time.monotonic() + 10
        while True:
            try:
                assert get(port, timeout=10) == 200
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "taking 1 listening socket(s) from systemd" in log


def test_the_unit_verifies(build_dir, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    # The unit as installed, pointing at the binary under test (verify checks it exists).
    unit = tmp_path / "spindle.service"
    unit.write_text(open(UNIT).read().replace("/usr/bin/spindle", spindle_bin(build_dir)))
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                         capture_output=True, text=True, timeout=60)
    problems = [line for line in out.stderr.splitlines()
                # Nothing of this machine's own units, and no running systemd, is ours.
                if "spindle" in line and "Failed to" not in line or "spindle.service:" in line]
    assert out.returncode == 0 and problems == [], out.stderr
    text = unit.read_text()
    for directive in ["Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "NoNewPrivileges=yes",
                      "ProtectSystem=strict", "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
                      "AmbientCapabilities=CAP_NET_BIND_SERVICE", "User=spindle"]:
        assert directive in text


def test_runs_as_the_unit_runs_it_read_only_another_user_no_new_privileges_one_capability(
        build_dir, tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop to what the unit leaves spindle")
    user = pwd.getpwnam("nobody")
    # A port below 1024 nobody holds: only CAP_NET_BIND_SERVICE lets an unprivileged user bind.
    for port in range(1000, 900, -1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
    binary = tmp_path / "spindle"
    shutil.copy(spindle_bin(build_dir), binary)  # a path `nobody` can reach
    os.chmod(tmp_path, 0o755)
    base = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            "--no-new-privs"]
    caps = ["--inh-caps=-all,+net_bind_service", "--ambient-caps=-all,+net_bind_service",
            "--bounding-set=-all,+net_bind_service"]
    argv = [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--threads", "2"]
    # ProtectSystem=strict: the whole file system read-only (a mount namespace of its own).
    read_only = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                 'mount --bind / / && mount -o remount,bind,ro / && exec "$@"', "sh"]
    probe = subprocess.run(read_only + ["sh", "-c", "! touch /tmp/spindle-ro-probe"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount namespace here: {probe.stderr.strip()}")
    server = Server(read_only + base + caps + argv)
    try:
        assert get(port) == 200
        status = open(f"/proc/{server.proc.pid}/status").read()
        assert re.search(r"^Uid:\s+%d\b" % user.pw_uid, status, re.M)
        assert re.search(r"^NoNewPrivs:\s+1", status, re.M)
        assert re.search(r"^CapEff:\s+0000000000000400$", status, re.M)  # net_bind_service only
    finally:
        assert server.stop() == 0
    # Without the capability the same user cannot bind there, and says so.
    out = subprocess.run(base + ["--inh-caps=-all", "--bounding-set=-all"] + argv,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "Permission denied" in out.stderr


def test_a_passed_socket_no_server_listens_on_is_said_and_closed(build_dir, tmp_path):
    held = listening_socket()
    port = held.getsockname()[1]
    other = free_port()
    config = tmp_path / "spindle.yaml"
    config.write_text(f"servers:\n  - listen: 127.0.0.1:{other}\n    default_site: true\n")
    proc = activated(build_dir, held, config)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                assert get(other) == 200
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        held.close()
    assert (f"127.0.0.1:{port}: a listening socket was passed for it, but no server listens "
            "there: closed") in proc.stderr.read()
