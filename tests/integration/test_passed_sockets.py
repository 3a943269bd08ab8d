"""Where `spindle serve` listens when sockets are passed to it and no address is configured
(neither --config nor --listen): on those sockets, whatever their address — started by systemd's
socket activation, through a reload, and in the process that takes over at an upgrade — and
not on the built-in 127.0.0.1:8080 (which closed the socket it was given)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

from proxy_support import free_port


def spindle_bin(build_dir):
    return os.path.abspath(os.path.join(build_dir, "bin", "spindle"))


def listening_socket():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


def get(port, timeout=10):
    """The status and body of GET / on 127.0.0.1:`port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=timeout) as r:
        return r.status, r.read().decode(errors="replace")


class Activated:
    """spindle started as systemd starts it: `sockets` as descriptors 3, 4, ..., LISTEN_FDS
    their count and LISTEN_PID its own PID (set by bash, which then execs it). Its standard output
    and error are read by threads, line by line."""

    def __init__(self, build_dir, sockets, *args):
        fds = [s.fileno() for s in sockets]
        # Each socket to a high descriptor first, above every socket's own (its own closed:
        # spindle gets no copy it does not know of), then down to 3, 4, ...: a socket already at
        # 3 or 4 is not overwritten before it is moved. (A fixed 20 was one of the sockets' own
        # in a pytest worker that had run many tests: that socket was closed before its move.)
        high = max(fds) + 1
        moves = " ".join(f"{high + i}<&{fd} {fd}<&-" for i, fd in enumerate(fds))
        downs = " ".join(f"{3 + i}<&{high + i} {high + i}<&-" for i in range(len(fds)))
        script = f'exec {moves}; exec {downs}; LISTEN_PID=$$ exec "$@"'
        env = {**os.environ, "LISTEN_FDS": str(len(fds))}
        self.proc = subprocess.Popen(["/bin/bash", "-c", script, "bash", spindle_bin(build_dir),
                                      "serve", "--threads", "1", *args],
                                     pass_fds=fds, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.output, self.errors = [], []
        for stream, lines in ((self.proc.stdout, self.output), (self.proc.stderr, self.errors)):
            threading.Thread(target=lambda s=stream, l=lines: l.extend(s), daemon=True).start()

    def listening(self, count, seconds=20):
        """The addresses of the first `count` listening lines, once written."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = [json.loads(line)["address"] for line in list(self.output)
                     if line.startswith('{"event":"listening"')]
            if len(found) >= count:
                return found
            assert self.proc.poll() is None, "".join(self.errors)
            time.sleep(0.02)
        raise AssertionError(f"fewer than {count} listening lines: {self.output}")

    def logged(self, words, seconds=10):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(words in line for line in list(self.errors)):
                return True
            time.sleep(0.02)
        return False

    def stop(self):
        """SIGTERM, then the exit code (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def address(s):
    host, port = s.getsockname()
    return f"{host}:{port}"


def refused(port, seconds=10):
    """True once a connection to 127.0.0.1:`port` is refused (nothing listens there)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except ConnectionRefusedError:
            return True
        except OSError:
            pass  # accepted into a queue nobody serves, not refused
        time.sleep(0.05)
    return False


def test_without_an_address_it_serves_on_the_socket_passed_through_a_reload(build_dir):
    held = listening_socket()
    where, port = address(held), held.getsockname()[1]
    server = Activated(build_dir, [held])
    held.close()  # spindle's copy alone now: closed by spindle, it would refuse connections
    try:
        assert server.listening(1) == [where]
        status, body = get(port)
        assert status == 200 and "spindle" in body.lower()
        assert server.logged("no address configured: the built-in server listens on the "
                             "socket(s) passed")
        # A reload reads the built-in configuration again: it still listens there, and only
        # there (a new address would have a listening line of its own).
        server.proc.send_signal(signal.SIGHUP)
        assert server.logged("reload (SIGHUP): configuration from (built-in configuration)")
        assert get(port)[0] == 200
        assert server.listening(1) == [where]
        assert [line for line in server.output if '"listening"' in line][1:] == []
        assert server.stop() == 0
    finally:
        server.stop()
    assert not any("a listening socket was passed for it" in line for line in server.errors)


def test_without_an_address_it_serves_on_every_socket_passed(build_dir):
    held = [listening_socket(), listening_socket()]
    where = sorted(address(s) for s in held)
    server = Activated(build_dir, held)
    for s in held:
        s.close()
    try:
        assert sorted(server.listening(2)) == where
        for each in where:
            assert get(int(each.rsplit(":", 1)[1]))[0] == 200
        assert server.stop() == 0
    finally:
        server.stop()


def test_the_process_taking_over_at_an_upgrade_serves_on_the_socket_passed(build_dir, tmp_path):
    held = listening_socket()
    where, port = address(held), held.getsockname()[1]
    sock = str(tmp_path / "handover.sock")
    old = Activated(build_dir, [held], "--handover", sock)
    held.close()
    new_pid = None
    try:
        assert old.listening(1) == [where]
        out = subprocess.run([spindle_bin(build_dir), "upgrade", "--handover", sock],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        new_pid = int(re.search(r"new process \((\d+)\)", out.stdout).group(1))
        # The new process writes to the old one's standard output: its line, the same address.
        assert old.listening(2) == [where, where]
        assert old.proc.wait(timeout=30) == 0
        assert get(port)[0] == 200
    finally:
        if new_pid is not None:
            try:
                os.kill(new_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        old.stop()


def test_with_listen_a_socket_passed_for_another_address_is_closed(build_dir):
    # An address given is where spindle listens: the socket passed for another is not used.
    held = listening_socket()
    where, port = address(held), held.getsockname()[1]
    server = Activated(build_dir, [held], "--listen", "127.0.0.1:0")
    held.close()
    try:
        [listens] = server.listening(1)
        assert listens != where
        assert get(int(listens.rsplit(":", 1)[1]))[0] == 200
        assert server.logged(f"{where}: a listening socket was passed for it, but no server "
                             "listens there: closed")
        assert refused(port)
        assert server.stop() == 0
    finally:
        server.stop()


def test_systemd_socket_activate_starts_spindle_serve_on_its_port(build_dir):
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        pytest.skip("systemd-socket-activate is not installed (Debian's systemd package)")
    port = free_port()
    proc = subprocess.Popen([tool, "-l", f"127.0.0.1:{port}", spindle_bin(build_dir), "serve",
                             "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # The tool listens at once and starts spindle on the first connection.
        deadline = time.monotonic() + 20
        while True:
            try:
                assert get(port)[0] == 200
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
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
    assert "no address configured" in log
