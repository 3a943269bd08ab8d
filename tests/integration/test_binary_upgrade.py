"""Zero-downtime binary upgrade: a new spindle takes the listening sockets over from the
running one (--handover, `spindle upgrade` or SIGUSR2), which drains and exits 0."""
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import Server
from proxy_support import addr, free_port, logged, request, upstream


def config_text(port, target):
    return f"""
servers:
  - name: public
    listen: 127.0.0.1:{port}
    access_log: off
routes:
  - {{name: r, match: {{path_prefix: /}}, service: s}}
services:
  s: {{url: "http://{addr(target)}"}}
"""


def start(build_dir, tmp_path, text):
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    sock = str(tmp_path / "handover.sock")
    server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                     "--threads", "2", "--handover", sock])
    return server, path, sock


def gone(pid, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def stop_pid(pid):
    """Ends the process `pid` (the new spindle, which an upgrade started) and waits for it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not gone(pid, 15):
        os.kill(pid, signal.SIGKILL)


def socket_file(path):
    """Which file is at `path`: a socket bound there later is another one, even where the
    file system gives it the inode number of one removed before."""
    st = os.stat(path)
    return st.st_ino, st.st_ctime_ns


def upgrade(build_dir, sock):
    out = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "upgrade", "--handover", sock],
                         capture_output=True, text=True, timeout=20)
    return out.returncode, out.stdout + out.stderr


def test_the_handover_point_is_open_once_the_servers_say_they_listen(build_dir, tmp_path):
    # Whoever saw spindle listening may upgrade it at once: its handover point is open before
    # the listening lines are written. (It once opened just after them: in about one start in
    # seven the socket was not there yet when the line was read, so a run of starts finds it.)
    config = tmp_path / "gateway.yaml"
    config.write_text("servers:\n  - {listen: 127.0.0.1:0, access_log: off}\n")
    missing = 0
    for i in range(30):
        sock = str(tmp_path / f"handover-{i}.sock")
        proc = subprocess.Popen([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                                 str(config), "--threads", "1", "--handover", sock],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout.readline(), "spindle exited before listening"
            missing += not os.path.exists(sock)  # looked at the moment the line is read
        finally:
            proc.terminate()
            assert proc.wait(timeout=15) == 0
    assert missing == 0, f"no handover socket yet in {missing} of 30 starts"


def test_a_new_process_owns_the_handover_point_once_it_says_it_listens(build_dir, tmp_path):
    # The same for the process an upgrade starts: once its listening line is out, the handover
    # point is its own (a socket file of its own at the path), so the next `spindle upgrade`
    # reaches it, not its predecessor (which answers that an upgrade is under way) nor a path
    # nobody listens on any more. Looked at the moment the line is read, through a chain of
    # upgrades; each one is then made at once.
    config = tmp_path / "gateway.yaml"
    config.write_text("servers:\n  - {listen: 127.0.0.1:0, access_log: off}\n")
    sock = str(tmp_path / "handover.sock")
    proc = subprocess.Popen([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                             str(config), "--threads", "1", "--handover", sock],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pids = [proc.pid]
    stale = 0
    try:
        assert '"listening"' in proc.stdout.readline(), "spindle exited before listening"
        inode = socket_file(sock)
        for _ in range(20):
            code, said = upgrade(build_dir, sock)
            assert code == 0, said
            pids.append(int(re.search(r"new process \((\d+)\)", said).group(1)))
            # The new process writes to the standard output of the one it replaced.
            assert '"listening"' in proc.stdout.readline(), "the new process did not listen"
            try:
                now = socket_file(sock)
            except FileNotFoundError:
                now = None  # unlinked by the new process, not yet bound again
            stale += now is None or now == inode
            inode = now
    finally:
        for pid in pids[1:]:
            stop_pid(pid)
        proc.terminate()
        proc.wait(timeout=20)
    assert stale == 0, f"in {stale} of 20 upgrades the handover point was not yet the new process's"


def test_an_upgrade_under_load_fails_no_request(build_dir, tmp_path):
    a = upstream(build_dir, "a")
    port = free_port()
    old, _, sock = start(build_dir, tmp_path, config_text(port, a))
    new_pid = None
    try:
        result = {}

        def load():
            result["out"] = subprocess.run(
                ["wrk", "-t2", "-c32", "-d6s", f"http://127.0.0.1:{port}/plaintext"],
                capture_output=True, text=True, timeout=60).stdout

        thread = threading.Thread(target=load)
        thread.start()
        time.sleep(2)
        code, said = upgrade(build_dir, sock)
        assert code == 0, said
        new_pid = int(re.search(r"new process \((\d+)\)", said).group(1))
        # The old process drains and exits 0; the new one serves on the same address.
        assert old.proc.wait(timeout=20) == 0
        thread.join()
        out = result["out"]
        done = int(re.search(r"(\d+) requests in", out).group(1))
        assert done > 1000, out
        assert "Socket errors" not in out and "Non-2xx" not in out, out
        status, headers, _ = request(old, "GET", "/headers")  # old.host/port: the same address
        assert status == 200 and headers["x-upstream"] == "a"
        assert not gone(new_pid, 0.1)
        assert logged(old, "taking over 1 listener(s)")
        assert logged(old, "upgrade: the new process serves; this one drains")
    finally:
        if new_pid:
            stop_pid(new_pid)
        old.stop()
        a.stop()


def test_sigusr2_upgrades_and_the_new_process_can_be_upgraded_again(build_dir, tmp_path):
    a = upstream(build_dir, "a")
    port = free_port()
    old, _, sock = start(build_dir, tmp_path, config_text(port, a))
    pids = []
    try:
        old.proc.send_signal(signal.SIGUSR2)
        # The new process's PID first, so that it is ended whatever fails below.
        assert logged(old, "upgrade: started", seconds=10)
        first = int(re.search(r"PID (\d+)", next(l for l in old.errors if "upgrade: started" in l)).group(1))
        pids.append(first)
        assert old.proc.wait(timeout=20) == 0
        assert request(old, "GET", "/headers")[0] == 200
        # The new process listens at the handover point in its turn.
        code, said = upgrade(build_dir, sock)
        assert code == 0, said
        second = int(re.search(r"new process \((\d+)\)", said).group(1))
        pids.append(second)
        assert gone(first, 20)
        assert request(old, "GET", "/headers")[0] == 200
    finally:
        for pid in pids:
            stop_pid(pid)
        old.stop()
        a.stop()


def test_a_new_process_that_cannot_start_leaves_the_old_one_serving(build_dir, tmp_path):
    a = upstream(build_dir, "a")
    port = free_port()
    old, path, sock = start(build_dir, tmp_path, config_text(port, a))
    try:
        # The file is broken by the time the new process reads it (the old one rejects it too,
        # and serves on).
        path.write_text("servers: [\n")
        code, said = upgrade(build_dir, sock)
        assert code == 0, said
        assert logged(old, "the new process exited (code 1) before taking over", seconds=10)
        assert old.proc.poll() is None
        assert request(old, "GET", "/headers")[0] == 200
        # Without --handover there is nothing to upgrade through.
        code, said = upgrade(build_dir, str(tmp_path / "nobody.sock"))
        assert code == 1 and "no spindle listens there" in said
    finally:
        old.stop()
        a.stop()
