"""The logs under faults: whatever their output does, they cost a bounded amount of memory, of
time on shutdown and of lines written. A stalled reader of the access log (a pipe nobody
reads) grows no memory past the bound (lines dropped and counted); SIGTERM and an upgrade's old
process still end within the drain time; SIGUSR1 and a reload reopen a renamed log file; the
error log never holds a worker, limits each place's lines, and bounds what a client sent. An
access log on /dev/full or whose folder is gone, SIGUSR1 storms and SIGTERM during them with
stdout stalled cost no request and no exit time."""
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

from conftest import memory_kib
from proxy_support import free_port, held_dead_port, metric, wait_until


class Spindle:
    """spindle serve with its standard output and error as pipes: the test reads the
    "listening" line, then reads stdout only if `read_stdout` (else nobody ever does: a stalled
    reader) and stderr only if `read_stderr`."""

    def __init__(self, build_dir, config, read_stdout=False, read_stderr=True, extra=()):
        self.proc = subprocess.Popen(
            [os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(config),
             "--threads", "1", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read()
        event = json.loads(line)
        self.port = int(event["address"].rsplit(":", 1)[1])
        self.errors = []
        self.output = []
        if read_stderr:
            threading.Thread(target=self._read, args=(self.proc.stderr, self.errors),
                             daemon=True).start()
        if read_stdout:
            threading.Thread(target=self._read, args=(self.proc.stdout, self.output),
                             daemon=True).start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append(line.decode(errors="replace"))

    def logged(self, *words, seconds=10):
        return wait_until(lambda: any(all(w in line for w in words) for line in list(self.errors)),
                          seconds)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Signals the process; (exit code, seconds it took) — (None, ...) if it was killed."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        return code, time.monotonic() - start


def write_config(tmp_path, text):
    path = tmp_path / "spindle.yaml"
    path.write_text(text)
    return path


def hammer(port, seconds, path="/plaintext", headers=b"", connections=4, limit=50_000):
    """Keep-alive clients sending GET `path` with extra `headers` for `seconds` (at most `limit`
    requests in all); the status lines seen, counted."""
    statuses = {}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    request = (f"GET {path} HTTP/1.1\r\nHost: localhost\r\n".encode() + headers + b"\r\n")
    sent = [0]

    def client():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            data = b""
            while time.monotonic() < deadline:
                with lock:
                    if sent[0] >= limit:
                        return
                    sent[0] += 1
                s.sendall(request)
                while b"\r\n\r\n" not in data:
                    more = s.recv(65536)
                    assert more, "closed"
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))
                while len(data) < length:
                    data += s.recv(65536)
                data = data[length:]
                status = head.split(b" ", 2)[1].decode()
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    return statuses


ACCESS_TO_STDOUT = """
admin: {{listen: 127.0.0.1:{admin}}}
drain_timeout: {drain}
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: {{path: "-", buffer: 1m}}
"""


def test_a_stalled_access_log_reader_costs_bounded_memory_and_drops_are_counted(build_dir,
                                                                               tmp_path):
    admin = free_port()
    server = Spindle(build_dir, write_config(tmp_path, ACCESS_TO_STDOUT.format(admin=admin,
                                                                             drain="2s")))
    try:
        hammer(server.port, 0.5)  # warm: pools and buffers at their working size
        before = memory_kib(server.proc.pid)
        peak = [before]
        sampling = True

        def sample():
            while sampling:
                peak[0] = max(peak[0], memory_kib(server.proc.pid))
                time.sleep(0.05)
        sampler = threading.Thread(target=sample)
        sampler.start()
        # 15 KB lines (a long User-Agent), nobody reading standard output.
        statuses = hammer(server.port, 4, headers=b"User-Agent: " + b"u" * 15_000 + b"\r\n")
        sampling = False
        sampler.join()
        assert set(statuses) == {"200"} and statuses["200"] > 200, statuses
        grown_mib = (peak[0] - before) / 1024
        # The bound (1 MiB), a worker's batch and the pipe's 64 KiB; not the lines' ~15 KB x
        # requests (hundreds of MB before the fix).
        assert grown_mib < 48, f"grew {grown_mib:.0f} MiB for {statuses['200']} requests"
        dropped = metric(admin, "spindle_log_lines_dropped_total", output="standard output")
        assert dropped is not None and dropped > 0
        assert metric(admin, "spindle_log_bytes_pending", output="standard output") <= 1 << 20
        assert server.logged("log output standard output", "line(s) dropped")
    finally:
        code, took = server.stop()
    # SIGTERM with standard output still stalled: done within the drain time (2 s), exit 0.
    assert code == 0
    assert took < 2 + 2, f"the exit took {took:.1f} s"


def test_sigterm_with_stalled_logs_ends_within_the_drain_time(build_dir, tmp_path):
    # Both outputs stalled: the access log (standard output) and the error log (standard error),
    # each full, with lines waiting behind.
    admin = free_port()
    dead, dead_port = held_dead_port()
    config = ACCESS_TO_STDOUT.format(admin=admin, drain="1s") + f"""
routes:
  - {{name: down, match: {{path_prefix: /down/}}, service: down}}
services:
  down: {{url: "http://127.0.0.1:{dead_port}", retries: {{attempts: 1}}}}
"""
    server = Spindle(build_dir, write_config(tmp_path, config), read_stderr=False)
    try:
        hammer(server.port, 1.5, headers=b"User-Agent: " + b"u" * 8000 + b"\r\n")
        hammer(server.port, 1.5, path="/down/x" + "y" * 2000)
        assert metric(admin, "spindle_log_lines_dropped_total", output="standard output") > 0
    finally:
        code, took = server.stop()
        dead.close()
    assert code == 0
    assert took < 1 + 2, f"the exit took {took:.1f} s with a drain time of 1 s"


def test_an_upgrades_old_process_ends_with_its_output_stalled(build_dir, tmp_path):
    handover = str(tmp_path / "handover.sock")
    admin = free_port()
    server = Spindle(build_dir, write_config(tmp_path, ACCESS_TO_STDOUT.format(admin=admin,
                                                                             drain="2s")),
                     extra=("--handover", handover))
    new_pid = None
    try:
        hammer(server.port, 1.5, headers=b"User-Agent: " + b"u" * 8000 + b"\r\n")
        out = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "upgrade", "--handover",
                              handover], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        new_pid = int(re.search(r"new process \((\d+)\)", out.stdout).group(1))
        start = time.monotonic()
        code = server.proc.wait(timeout=30)
        # Its drain: idle connections get two seconds, then the drain time (2 s) at most.
        assert code == 0 and time.monotonic() - start < 2 + 2 + 2
    finally:
        server.stop()
        if new_pid is not None:
            os.kill(new_pid, signal.SIGTERM)
            # (Not our child: it is gone when /proc no longer has it, or it is a zombie.)
            assert wait_until(lambda: not os.path.exists(f"/proc/{new_pid}") or
                              "Z" in open(f"/proc/{new_pid}/stat").read().split()[2], 10)


def access_lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def test_sigusr1_and_a_reload_reopen_a_renamed_access_log(build_dir, tmp_path):
    log = tmp_path / "access.log"
    config = write_config(tmp_path, f"""
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: {{path: {log}, format: json}}
""")
    server = Spindle(build_dir, config)

    def requests(tag, n):
        statuses = hammer(server.port, 30, path=f"/plaintext?{tag}", connections=1, limit=n)
        assert statuses == {"200": n}

    try:
        requests("first", 5)
        assert wait_until(lambda: len(access_lines(log)) == 5)
        os.rename(log, f"{log}.1")
        server.proc.send_signal(signal.SIGUSR1)  # logrotate's reopen signal
        assert server.logged("SIGUSR1", "opened again")
        requests("second", 7)
        assert wait_until(lambda: len(access_lines(log)) == 7)
        assert all("second" in line for line in access_lines(log))
        assert len(access_lines(f"{log}.1")) == 5
        # A reload opens it again too.
        os.rename(log, f"{log}.2")
        server.proc.send_signal(signal.SIGHUP)
        assert server.logged("reload (SIGHUP)", "in force")
        requests("third", 3)
        assert wait_until(lambda: len(access_lines(log)) == 3)
        assert len(access_lines(f"{log}.2")) == 7
        # Signals in a burst while requests come: the process lives, and every line lands
        # whole in one of the files.
        burst = threading.Thread(target=lambda: [
            (server.proc.send_signal(signal.SIGUSR1 if i % 3 else signal.SIGHUP), time.sleep(0.005))
            for i in range(60)])
        burst.start()
        requests("fourth", 200)
        burst.join()
        assert server.proc.poll() is None
        lines = lambda: [l for l in access_lines(log) if "fourth" in l]
        assert wait_until(lambda: len(lines()) == 200)
        assert all(json.loads(line)["status"] == 200 for line in lines())
    finally:
        code, _ = server.stop()
    assert code == 0


DOWN = """
admin: {{listen: 127.0.0.1:{admin}}}
servers:
  - listen: 127.0.0.1:0
    access_log: off
routes:
  - {{name: down, match: {{path_prefix: /}}, service: down}}
services:
  down: {{url: "http://127.0.0.1:{port}", retries: {{attempts: 1}}}}
"""


def test_a_stalled_error_log_never_holds_a_worker(build_dir, tmp_path):
    # Every request to a refused upstream logs a line; nobody reads standard error.
    dead, dead_port = held_dead_port()
    admin = free_port()
    server = Spindle(build_dir, write_config(tmp_path, DOWN.format(admin=admin, port=dead_port)),
                     read_stderr=False)
    try:
        # Long paths make the lines long; for 4 s, so that even the lines each place may write
        # a second (kLogBurst) fill the pipe (64 KiB) many times over.
        statuses = hammer(server.port, 4, path="/" + "p" * 4000, connections=2, limit=10**6)
        assert set(statuses) == {"502"} and statuses["502"] > 1000, statuses
        dropped = metric(admin, "spindle_log_lines_dropped_total", output="standard error")
        suppressed = metric(admin, "spindle_log_lines_suppressed_total")
        assert dropped + suppressed > 0
    finally:
        code, took = server.stop()
        dead.close()
    assert code == 0 and took < 10 + 2


def test_error_lines_are_limited_per_place_and_bound_what_the_client_sent(build_dir, tmp_path):
    dead, dead_port = held_dead_port()
    admin = free_port()
    server = Spindle(build_dir, write_config(tmp_path, DOWN.format(admin=admin, port=dead_port)))
    try:
        long_path = "/" + "q" * 6000
        statuses = hammer(server.port, 30, path=long_path, connections=1, limit=300)
        assert statuses == {"502": 300}
        # The line naming the failure, with the client's path cut to its first bytes.
        assert server.logged("route down", "answered 502")
        failures = [l for l in server.errors if "route down" in l and "answered 502" in l]
        assert all(len(l) < 1500 and "more bytes)" in l for l in failures), failures[:1]
        # At most the burst a second from that place; the rest said in a count.
        assert server.logged("similar line(s) suppressed")
        assert metric(admin, "spindle_log_lines_suppressed_total") > 0
        assert len(failures) < 300
    finally:
        code, _ = server.stop()
        dead.close()
    assert code == 0


def test_an_access_log_buffer_below_a_few_batches_is_refused_with_its_line(build_dir, tmp_path):
    path = write_config(tmp_path, "servers:\n  - listen: 127.0.0.1:0\n"
                                  "    access_log: {path: '-', buffer: 1k}\n")
    done = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config", str(path)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "spindle.yaml:3: servers[0].access_log.buffer: at least 64k" in done.stderr, done.stderr


# ---- logs: outputs that fail --------------------------------------------------------------


def test_an_access_log_on_dev_full_slows_no_request_and_exits_in_time(build_dir, tmp_path):
    admin = free_port()
    config = write_config(tmp_path, f"""
admin: {{listen: 127.0.0.1:{admin}}}
drain_timeout: 1s
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: {{path: /dev/full}}
""")
    server = Spindle(build_dir, config, read_stdout=True)
    try:
        statuses = hammer(server.port, 2, headers=b"User-Agent: " + b"u" * 2000 + b"\r\n")
        assert set(statuses) == {"200"} and statuses["200"] > 100, statuses
        for sig in [signal.SIGUSR1] * 20:
            server.proc.send_signal(sig)
        statuses = hammer(server.port, 1)
        assert set(statuses) == {"200"}, statuses
        assert server.proc.poll() is None
        assert server.logged("dropped", seconds=10), server.errors[-5:]
    finally:
        code, took = server.stop()
    assert code == 0 and took < 1 + 2, (code, took)


def test_an_access_log_whose_folder_is_gone_survives_sigusr1_storms_and_keeps_its_lines(
        build_dir, tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / "access.log"
    config = write_config(tmp_path, f"""
drain_timeout: 1s
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: {{path: {log}, format: json}}
""")
    server = Spindle(build_dir, config, read_stdout=True)
    try:
        assert hammer(server.port, 30, connections=1, limit=5) == {"200": 5}
        held = open(log)  # the file, through an open descriptor, after its folder is gone
        os.rename(log, tmp_path / "moved.log")
        os.rmdir(folder)
        burst = threading.Thread(target=lambda: [
            (server.proc.send_signal(signal.SIGUSR1), time.sleep(0.002)) for _ in range(200)])
        burst.start()
        statuses = hammer(server.port, 30, path="/plaintext?storm", connections=2, limit=300)
        burst.join()
        assert statuses == {"200": 300}
        assert server.proc.poll() is None
        assert server.logged("cannot open it again")
        # The lines went on to the file it was, each whole.
        lines = lambda: open(tmp_path / "moved.log").read().splitlines()
        assert wait_until(lambda: sum("storm" in l for l in lines()) == 300, 10), len(lines())
        assert all(json.loads(l)["status"] == 200 for l in lines())
        held.close()
        # Bounded lines: the storm of failed reopens did not log a line per signal.
        assert sum("cannot open it again" in l for l in server.errors) <= 40, \
            sum("cannot open it again" in l for l in server.errors)
    finally:
        code, took = server.stop()
    assert code == 0 and took < 1 + 2, (code, took)


def test_sigterm_during_a_sigusr1_storm_with_stdout_stalled_ends_in_time(build_dir, tmp_path):
    admin = free_port()
    config = write_config(tmp_path, f"""
admin: {{listen: 127.0.0.1:{admin}}}
drain_timeout: 1s
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: {{path: "-", buffer: 1m}}
""")
    server = Spindle(build_dir, config)  # nobody reads standard output
    try:
        hammer(server.port, 1.5, headers=b"User-Agent: " + b"u" * 8000 + b"\r\n")
        assert metric(admin, "spindle_log_lines_dropped_total", output="standard output") > 0
        stop = [False]

        def storm():
            while not stop[0] and server.proc.poll() is None:
                try:
                    server.proc.send_signal(signal.SIGUSR1)
                except ProcessLookupError:
                    return
                time.sleep(0.002)
        t = threading.Thread(target=storm)
        t.start()
        time.sleep(0.3)
    finally:
        code, took = server.stop()
        stop[0] = True
        t.join()
    assert code == 0 and took < 1 + 2, (code, took)
