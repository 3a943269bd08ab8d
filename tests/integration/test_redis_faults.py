"""Redis, as the store of shared rate limits, under faults: a reply announcing more than it
could ever hold is refused as it is read, an error reply (READONLY after a failover, OOM,
BUSY) backs off as a failed connection does, with one log line per back-off, and reloads leave
no limiter, client or connection behind."""
import re
import signal
import socket
import threading
import time

import pytest

from proxy_support import (SERVER, ScriptedUpstream, addr, free_port, gateway, logged, request,
                           upstream, wait_until)
from test_dns_faults import admin_metrics, metric
from test_reload import Gateway
from test_rate_limit_redis import Redis, limited, redis, statuses  # noqa: F401 (fixtures)


class HugeReplyRedis(ScriptedUpstream):
    """Answers every command of every connection with a 14-byte reply announcing 2^31-1
    elements."""

    def handle(self, conn):
        with conn:
            while conn.recv(65536):
                conn.sendall(b"*2147483647\r\n")


CLOSED = "{key: route, rate: 1000/s, burst: 1000, store: redis, failure_mode: closed}"
CLOSED_BATCH_1 = CLOSED.replace("}", ", batch: 1}")  # one EVAL a request


def test_a_reply_announcing_two_billion_elements_is_refused_as_it_is_read(build_dir, tmp_path):
    a = upstream(build_dir, "a")
    fake = HugeReplyRedis()
    gw = gateway(build_dir, tmp_path, limited(fake.port, CLOSED, f"{a.host}:{a.port}",
                                              extra_redis=", backoff: 100ms"))
    try:
        # Each answer comes at once (refused, not waited for past the timeout) and says
        # the store is unavailable.
        for status, seconds in statuses(gw, 5):
            assert status == 503
        assert logged(gw, "redis", "a reply announcing more than 1024 elements")
        assert not logged(gw, "no reply in time", seconds=0.2)
    finally:
        gw.stop()
        fake.stop()
        a.stop()


def error_replies(admin):
    """spindle_redis_error_replies_total by error label, from the admin listener at `admin`."""
    text = admin_metrics(admin)
    return {label: metric(text, f'spindle_redis_error_replies_total{{error="{label}"}}')
            for label in ("READONLY", "OOM", "BUSY", "LOADING", "other")}


def test_an_error_reply_backs_off_and_is_logged_once_per_back_off(build_dir, tmp_path, redis):
    a = upstream(build_dir, "a")
    admin = free_port()
    # batch: 1, so that each request asks Redis.
    gw = gateway(build_dir, tmp_path, f"admin: {{listen: 127.0.0.1:{admin}}}\n" +
                 limited(redis.port, CLOSED_BATCH_1, f"{a.host}:{a.port}",
                         extra_redis=", backoff: 5s"))
    try:
        assert [s for s, _ in statuses(gw, 2)] == [200, 200]
        assert set(error_replies(admin).values()) == {0}
        # A failover made this Redis a replica: the script's writes are refused (READONLY).
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        redis.command("REPLICAOF", "127.0.0.1", str(holder.getsockname()[1]))
        try:
            got = statuses(gw, 40, path="/plaintext?x")
            # 503 until the back-off is over, without asking Redis again.
            assert [s for s, _ in got] == [503] * 40, got
            assert logged(gw, "READONLY")
            lines = [line for line in gw.errors if "READONLY" in line]
            # One line per worker per back-off (2 workers), never one per request.
            assert 1 <= len(lines) <= 2, lines
            assert not any("rate_limit: redis" in line for line in gw.errors)
            # Counted in /metrics, under READONLY: the replies that came (one per worker that
            # asked before its back-off), not the requests refused during the back-off.
            counted = error_replies(admin)
            assert 1 <= counted.pop("READONLY") <= 2, counted
            assert set(counted.values()) == {0}, counted
        finally:
            redis.command("REPLICAOF", "NO", "ONE")
            holder.close()
    finally:
        gw.stop()
        a.stop()


def reloading_config(redis_port, upstream_addr, i):
    """Reload `i`: a local limit and a Redis one whose settings, and the redis section itself,
    differ from every other reload's."""
    return SERVER + f"""
redis: {{address: 127.0.0.1:{redis_port}, timeout: {100 + i}ms}}
routes:
  - name: version
    match: {{path: /version}}
    middlewares:
      - respond: {{body: "{i}"}}
    service: a
  - name: local
    match: {{path_prefix: /plaintext}}
    middlewares:
      - rate_limit: {{key: client_ip, rate: {1000 + i}/s, burst: 1000}}
    service: a
  - name: shared
    match: {{path_prefix: /}}
    middlewares:
      - rate_limit: {{key: route, rate: {1000 + i}/s, burst: 1000, store: redis}}
    service: a
services:
  a: {{url: "http://{upstream_addr}"}}
"""


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_reloads_free_the_limits_and_redis_connections_they_drop(build_dir, tmp_path, redis):
    # Each reload changes both limits and the redis section: every one of them is new. After
    # 60, memory and Redis connections are what one configuration needs, not 60.
    a = upstream(build_dir, "a")
    gw = Gateway(build_dir, tmp_path, reloading_config(redis.port, f"{a.host}:{a.port}", 0))
    pid = gw.server.proc.pid

    def connected():
        info = redis.command("INFO", "clients")
        return int(re.search(r"connected_clients:(\d+)", info).group(1)) - 1  # ours

    try:
        rss = {}
        for i in range(1, 61):
            # (Its log line may be suppressed, at many reloads a second: the answer tells.)
            gw.write(reloading_config(redis.port, f"{a.host}:{a.port}", i))
            gw.server.proc.send_signal(signal.SIGHUP)
            assert wait_until(lambda: request(gw.server, "GET", "/version")[2] == str(i).encode())
            # Several connections, so that both workers use both limits.
            for _ in range(4):
                assert request(gw.server, "GET", "/plaintext")[0] == 200
                assert request(gw.server, "GET", "/users/1")[0] == 200
            if i in (10, 60):
                rss[i] = rss_kib(pid)
        # One connection per worker that asked Redis (2 workers), the others closed.
        assert wait_until(lambda: connected() <= 2, seconds=5), connected()
        # Each local table is 1 MiB: 50 kept would be 50 MiB more. (ASan keeps freed memory
        # in its quarantine: there only the connections tell.)
        if "asan" not in str(build_dir):
            assert rss[60] - rss[10] < 16 * 1024, rss
    finally:
        gw.stop()
        a.stop()


# ---- Redis: hostile and absurd replies ------------------------------------------------------


def resp_commands(data):
    """The complete RESP commands (arrays of bulk strings) at the start of `data`: (a list of
    argument lists, the bytes left over)."""
    commands = []
    while True:
        if not data.startswith(b"*") or b"\r\n" not in data:
            return commands, data
        line, _, rest = data.partition(b"\r\n")
        args = []
        for _ in range(int(line[1:])):
            if b"\r\n" not in rest:
                return commands, data
            size_line, _, after = rest.partition(b"\r\n")
            size = int(size_line[1:])
            if len(after) < size + 2:
                return commands, data
            args.append(after[:size])
            rest = after[size + 2:]
        commands.append(args)
        data = rest


class FakeRedis(ScriptedUpstream):
    """Answers each EVAL with `self.reply(n)` (n counts EVALs from 0, over all connections);
    anything else +OK."""

    def __init__(self):
        self.evals = 0
        self.lock = threading.Lock()
        super().__init__()

    def reply(self, n):
        raise NotImplementedError

    def handle(self, conn):
        data = b""
        with conn:
            try:
                while chunk := conn.recv(65536):
                    commands, data = resp_commands(data + chunk)
                    for args in commands:
                        if args and args[0].upper() == b"EVAL":
                            with self.lock:
                                n = self.evals
                                self.evals += 1
                            conn.sendall(self.reply(n))
                        else:
                            conn.sendall(b"+OK\r\n")
            except OSError:
                pass


def scripted_redis(replies, then):
    """A FakeRedis answering its EVALs with `replies` in order, then `then` forever."""
    class Scripted(FakeRedis):
        def reply(self, n):
            return replies[n] if n < len(replies) else then
    return Scripted()


def pair(a, b):
    return b"*2\r\n:%d\r\n:%d\r\n" % (a, b)


def one_worker_limit(build_dir, tmp_path, redis_port, target, limit, extra_redis=""):
    return gateway(build_dir, tmp_path, limited(redis_port, limit, addr(target),
                                                extra_redis=extra_redis), threads=1)


def test_redis_granting_more_than_the_batch_asked_does_not_lift_the_limit(
        build_dir, tmp_path, up):
    # Attack: a Redis (a broken proxy in front of it, a script of another version) answers the
    # first take with a million tokens, then refuses. batch: 1 asks for one at a time: at most
    # one request may pass before the refusals.
    fake = scripted_redis([pair(1_000_000, 0)], then=pair(0, 1_000_000))
    gw = one_worker_limit(build_dir, tmp_path, fake.port, up,
                          "{key: route, rate: 1/s, burst: 1, store: redis, batch: 1}")
    try:
        got = [s for s, _ in statuses(gw, 10)]
        assert got.count(200) <= 1, got
        assert fake.evals >= 2, fake.evals
    finally:
        gw.stop()
        fake.stop()


@pytest.mark.parametrize("ahead", [10**15, 2**63 - 1])
def test_an_absurd_wait_from_redis_is_bounded_by_the_limits_own_settings(
        build_dir, tmp_path, up, ahead):
    # Attack: one reply says the key's next slot is 31 years (or 2^63 µs) ahead; Redis then
    # answers sanely. The GCRA's arrival time is never more than burst / rate ahead of now
    # (1 s here): the refusal may not outlast that, nor say more in Retry-After.
    fake = scripted_redis([pair(0, ahead)], then=pair(1, 0))
    gw = one_worker_limit(build_dir, tmp_path, fake.port, up,
                          "{key: route, rate: 10/s, burst: 10, store: redis, batch: 1}")
    try:
        status, fields, _ = request(gw, "GET", "/plaintext")
        assert status == 429
        assert int(fields["Retry-After"]) <= 2, fields["Retry-After"]
        assert wait_until(lambda: request(gw, "GET", "/plaintext")[0] == 200, seconds=3)
    finally:
        gw.stop()
        fake.stop()


class RawRedis(ScriptedUpstream):
    """Answers every read with `self.answer` bytes (whatever was asked)."""

    def __init__(self, answer, trickle=None):
        self.answer = answer
        self.trickle = trickle
        super().__init__()

    def handle(self, conn):
        with conn:
            try:
                while conn.recv(65536):
                    if self.trickle is None:
                        conn.sendall(self.answer)
                        continue
                    for byte in self.answer:
                        conn.sendall(bytes([byte]))
                        time.sleep(self.trickle)
            except OSError:
                pass


@pytest.mark.parametrize("answer,why", [
    (b"*1\r\n" * 12 + b":1\r\n", "nested 12 deep"),
    (b"$2000000\r\n" + b"x" * 2_000_002, "a 2 MB bulk string"),
    (b"+OK\r\n", "a status where an array was due"),
    (b"*2\r\n$1\r\n1\r\n$1\r\n0\r\n", "strings where integers were due"),
    (b"*3\r\n:1\r\n:0\r\n:0\r\n", "three elements"),
    (b"%1\r\n:1\r\n:2\r\n", "a RESP3 map"),
    (b"\x00\xff garbage\r\n", "no RESP at all"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_malformed_redis_reply_is_a_failed_store_answered_at_once(build_dir, tmp_path, up,
                                                                    answer, why):
    fake = RawRedis(answer)
    gw = one_worker_limit(build_dir, tmp_path, fake.port, up, CLOSED_BATCH_1,
                          extra_redis=", backoff: 200ms")
    try:
        got = statuses(gw, 6)
        assert [s for s, _ in got] == [503] * 6, (why, got)
        # Each at once: refused as read, never waited for past the timeout (100 ms).
        assert max(t for _, t in got) < 2.0, got
        lines = [line for line in gw.errors if "redis" in line]
        assert len(lines) <= 6, lines  # never more than one a request
    finally:
        gw.stop()
        fake.stop()


def test_a_redis_error_reply_of_half_a_megabyte_logs_a_bounded_line(build_dir, tmp_path, up):
    fake = RawRedis(b"-READONLY " + b"y" * (512 << 10) + b"\r\n")
    gw = one_worker_limit(build_dir, tmp_path, fake.port, up, CLOSED_BATCH_1,
                          extra_redis=", backoff: 5s")
    try:
        assert [s for s, _ in statuses(gw, 5)] == [503] * 5
        assert logged(gw, "READONLY")
        lines = [line for line in gw.errors if "READONLY" in line]
        assert len(lines) == 1, len(lines)
        assert len(lines[0]) < 2048, len(lines[0])
    finally:
        gw.stop()
        fake.stop()


def test_a_trickling_redis_is_bounded_by_the_timeout_and_holds_no_other_client(
        build_dir, tmp_path, up):
    # One byte every 40 ms: each read comes well within the 100 ms timeout, the reply never.
    fake = RawRedis(b"*2\r\n:1\r\n:0\r\n" * 50, trickle=0.04)
    gw = gateway(build_dir, tmp_path, SERVER + f"""
redis: {{address: 127.0.0.1:{fake.port}, timeout: 100ms, backoff: 100ms}}
routes:
  - name: free
    match: {{path_prefix: /headers}}
    service: a
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - rate_limit: {CLOSED_BATCH_1}
    service: a
services:
  a: {{url: "http://{addr(up)}"}}
""", threads=1)
    try:
        done = []
        clients = [threading.Thread(target=lambda: done.append(statuses(gw, 3)))
                   for _ in range(3)]
        for c in clients:
            c.start()
        for _ in range(5):
            start = time.monotonic()
            assert request(gw, "GET", "/headers")[0] == 200
            assert time.monotonic() - start < 1.0
        for c in clients:
            c.join(10)
        flat = [x for got in done for x in got]
        assert len(flat) == 9
        assert all(s == 503 for s, _ in flat), flat
        assert max(t for _, t in flat) < 1.5, flat
    finally:
        gw.stop()
        fake.stop()


# ---- Redis: refusals at connection time, a proxy closing after each reply --------------------


class RefusingAuthRedis(FakeRedis):
    """Refuses AUTH (a rotated password); counts the connections it took."""

    def handle(self, conn):
        data = b""
        with conn:
            try:
                while chunk := conn.recv(65536):
                    commands, data = resp_commands(data + chunk)
                    for args in commands:
                        conn.sendall(b"-WRONGPASS invalid username-password pair\r\n"
                                     if args[0].upper() == b"AUTH" else b"-NOAUTH\r\n")
            except OSError:
                pass


def test_a_refused_redis_password_backs_off_without_a_log_flood(build_dir, tmp_path, up):
    fake = RefusingAuthRedis()
    gw = gateway(build_dir, tmp_path, limited(fake.port, CLOSED_BATCH_1, addr(up),
                                              extra_redis=", password: rotated, backoff: 5s"))
    try:
        got = [s for s, _ in statuses(gw, 30)]
        assert got == [503] * 30, got
        # Two workers: at most one connection and one line each per back-off.
        assert fake.accepted <= 2, fake.accepted
        assert logged(gw, "redis", "WRONGPASS")  # (read from its log a moment after)
        lines = [line for line in gw.errors if "redis" in line]
        assert 1 <= len(lines) <= 2, lines
    finally:
        gw.stop()
        fake.stop()


class OneReplyRedis(FakeRedis):
    """Grants each EVAL one token, then closes the connection (a proxy in front of Redis that
    ends every connection after one reply)."""

    def reply(self, n):
        return pair(1, 0)

    def handle(self, conn):
        with conn:
            data = b""
            try:
                while chunk := conn.recv(65536):
                    commands, data = resp_commands(data + chunk)
                    if any(a and a[0].upper() == b"EVAL" for a in commands):
                        conn.sendall(pair(1, 0))
                        return
                    conn.sendall(b"+OK\r\n" * len(commands))
            except OSError:
                pass


def test_a_redis_closing_after_each_reply_costs_no_log_flood_nor_a_stall(build_dir, tmp_path,
                                                                         up):
    fake = OneReplyRedis()
    gw = gateway(build_dir, tmp_path, limited(fake.port, CLOSED_BATCH_1, addr(up),
                                              extra_redis=", backoff: 300ms"), threads=1)
    try:
        got = statuses(gw, 40)
        assert set(s for s, _ in got) <= {200, 503}, got
        assert 200 in [s for s, _ in got]
        assert max(t for _, t in got) < 1.0, got
        lines = [line for line in gw.errors if "redis" in line]
        assert len(lines) <= 20, lines
    finally:
        gw.stop()
        fake.stop()


class SlowRedis(FakeRedis):
    """Answers each EVAL with one token, 300 ms late."""

    def reply(self, n):
        time.sleep(0.3)
        return pair(1, 0)


def test_a_slow_redis_backs_off_with_one_line_per_back_off(build_dir, tmp_path, up):
    fake = SlowRedis()
    gw = gateway(build_dir, tmp_path, limited(fake.port, CLOSED_BATCH_1, addr(up),
                                              extra_redis=", backoff: 5s"), threads=1)
    try:
        got = statuses(gw, 30)
        assert [s for s, _ in got] == [503] * 30, got
        assert max(t for _, t in got) < 1.0, got
        assert logged(gw, "redis", "no reply in time")  # (read from its log a moment after)
        lines = [line for line in gw.errors if "redis" in line]
        assert 1 <= len(lines) <= 2, lines
    finally:
        gw.stop()
        fake.stop()
