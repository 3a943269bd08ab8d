"""Redis, as the store of shared rate limits, under faults: a reply announcing more than it
could ever hold is refused as it is read, an error reply (READONLY after a failover, OOM,
BUSY) backs off as a failed connection does, with one log line per back-off, and reloads leave
no limiter, client or connection behind."""
import re
import signal
import socket

from proxy_support import (SERVER, ScriptedUpstream, free_port, gateway, logged, request,
                           upstream, wait_until)
from test_dns_faults import admin_metrics, metric
from test_reload import Gateway
from test_rate_limit_redis import Redis, limited, redis, statuses  # noqa: F401 (fixture)


class HugeReplyRedis(ScriptedUpstream):
    """Answers every command of every connection with a 14-byte reply announcing 2^31-1
    elements."""

    def handle(self, conn):
        with conn:
            while conn.recv(65536):
                conn.sendall(b"*2147483647\r\n")


CLOSED = "{key: route, rate: 1000/s, burst: 1000, store: redis, failure_mode: closed}"


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
                 limited(redis.port, CLOSED.replace("}", ", batch: 1}"), f"{a.host}:{a.port}",
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
