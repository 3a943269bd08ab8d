"""Redis, as the store of shared rate limits, under faults: a reply announcing more than it
could ever hold is refused as it is read, an error reply (READONLY after a failover, OOM,
BUSY) backs off as a failed connection does, with one log line per back-off, and reloads leave
no limiter, client or connection behind."""
import socket
import threading

from proxy_support import ScriptedUpstream, gateway, logged, read_request_head, upstream
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


def test_an_error_reply_backs_off_and_is_logged_once_per_back_off(build_dir, tmp_path, redis):
    a = upstream(build_dir, "a")
    # batch: 1, so that each request asks Redis.
    gw = gateway(build_dir, tmp_path, limited(redis.port, CLOSED.replace("}", ", batch: 1}"),
                                              f"{a.host}:{a.port}", extra_redis=", backoff: 5s"))
    try:
        assert [s for s, _ in statuses(gw, 2)] == [200, 200]
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
        finally:
            redis.command("REPLICAOF", "NO", "ONE")
            holder.close()
    finally:
        gw.stop()
        a.stop()
