"""Rate limits shared through a real Redis (Debian's redis-server, started here on loopback):
several instances hold one limit together, Redis is asked once per batch of tokens rather than
per request, and a Redis that is gone or hangs costs a request at most the Redis timeout."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from proxy_support import SERVER, config_error, free_port, gateway, logged, upstream, wait_until


class Redis:
    """A redis-server of the test's own on 127.0.0.1, without persistence."""

    def __init__(self, tmp_path, password=None, port=None):
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not installed (scripts/install-deps.sh test installs it)")
        self.port = port or free_port()
        self.password = password
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(tmp_path)]
        if password:
            argv += ["--requirepass", password]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(lambda: self._answers(), seconds=10), "redis-server did not start"

    def _answers(self):
        try:
            return self.command("PING") in ("PONG", "NOAUTH Authentication required.")
        except OSError:
            return False

    def command(self, *args):
        """One command on a new connection (after AUTH when there is a password): the reply's
        first line, without its type marker, or for a bulk string its text."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            calls = ([("AUTH", self.password)] if self.password else []) + [args]
            for call in calls:
                s.sendall(f"*{len(call)}\r\n".encode() + b"".join(
                    f"${len(str(a))}\r\n{a}\r\n".encode() for a in call))
            data = b""
            while data.count(b"\r\n") < len(calls) or (data.split(b"\r\n")[len(calls) - 1]
                                                       .startswith(b"$") and
                                                       data.count(b"\r\n") < len(calls) + 1):
                more = s.recv(1 << 20)
                if not more:
                    break
                data += more
            lines = data.split(b"\r\n")
            last = lines[len(calls) - 1].decode()
            if last.startswith("$"):
                return b"\r\n".join(lines[len(calls):]).decode()
            return last[1:]

    def evals(self):
        """EVAL calls Redis has answered so far."""
        info = self.command("INFO", "commandstats")
        m = re.search(r"cmdstat_eval:calls=(\d+)", info)
        return int(m.group(1)) if m else 0

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path)
    yield r
    r.stop()


def limited(redis_port, limit, upstream_addr, extra_redis="", log=None):
    access_log = f"access_log: {{path: {log}, format: json}}" if log else "access_log: off"
    return SERVER.replace("access_log: off", access_log) + f"""
redis: {{address: 127.0.0.1:{redis_port}, timeout: 100ms{extra_redis}}}
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - rate_limit: {limit}
    service: a
services:
  a: {{url: "http://{upstream_addr}"}}
"""


def wrk(url, seconds, connections=4):
    """wrk against `url`: (requests, non-2xx answers, socket errors)."""
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", url],
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    done = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    return done, int(non2xx.group(1)) if non2xx else 0, errors


def statuses(gw, count, path="/plaintext"):
    """`count` requests on one keep-alive connection: [(status, seconds taken)]."""
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=10)
    out = []
    try:
        for _ in range(count):
            start = time.monotonic()
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            out.append((response.status, time.monotonic() - start))
    finally:
        conn.close()
    return out


def test_two_instances_hold_one_limit_together(build_dir, tmp_path, redis):
    if shutil.which("wrk") is None:
        pytest.fail("wrk is not installed (scripts/install-deps.sh test installs it)")
    a = upstream(build_dir, "a")
    rate, burst, seconds = 50, 50, 3
    text = limited(redis.port, f"{{key: route, rate: {rate}/s, burst: {burst}, store: redis}}",
                   f"{a.host}:{a.port}")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = gateway(build_dir, tmp_path / "one", text)
    two = gateway(build_dir, tmp_path / "two", text)
    try:
        results = {}
        threads = [threading.Thread(target=lambda gw=gw: results.__setitem__(
            gw.port, wrk(f"http://{gw.host}:{gw.port}/plaintext", seconds))) for gw in (one, two)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        window = time.monotonic() - start
        requests = sum(r[0] for r in results.values())
        admitted = sum(r[0] - r[1] for r in results.values())
        assert all(r[2] == 0 for r in results.values()), results
        # Never more than the limit over both (every admitted request spent a token Redis
        # granted); fewer by at most the tokens held unspent: 1.5 batches (here 5) per worker
        # (2) per instance (2) = 30, and what wrk's start-up skew costs.
        most = burst + rate * window
        least = burst + rate * seconds - 30 - rate * 0.5
        assert least <= admitted <= most, (admitted, least, most, results)
        # Both instances got a share.
        assert all(r[0] - r[1] > 10 for r in results.values()), results
        # Redis was asked far less often than once per request.
        assert redis.evals() < requests / 10, (redis.evals(), requests)
    finally:
        one.stop()
        two.stop()
        a.stop()


def test_redis_is_asked_once_per_batch_not_once_per_request(build_dir, tmp_path, redis):
    if shutil.which("wrk") is None:
        pytest.fail("wrk is not installed (scripts/install-deps.sh test installs it)")
    a = upstream(build_dir, "a")
    gw = gateway(build_dir, tmp_path, limited(
        redis.port, "{key: route, rate: 100000/s, burst: 100000, store: redis, batch: 200}",
        f"{a.host}:{a.port}"))
    try:
        requests, refused, errors = wrk(f"http://{gw.host}:{gw.port}/plaintext", 2)
        assert refused == 0 and errors == 0
        assert requests > 2000
        # A batch of 200, the next fetched when half is spent: about one call per 200
        # requests per worker, a few more at the start.
        assert 0 < redis.evals() <= requests / 100 + 8, (redis.evals(), requests)
    finally:
        gw.stop()
        a.stop()


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_a_hanging_redis_costs_a_request_at_most_the_timeout(build_dir, tmp_path, redis, mode):
    a = upstream(build_dir, "a")
    log = tmp_path / "access.json"
    gw = gateway(build_dir, tmp_path, limited(
        redis.port, f"{{key: client_ip, rate: 5/s, burst: 5, store: redis, failure_mode: {mode}}}",
        f"{a.host}:{a.port}", extra_redis=", backoff: 300ms", log=log))
    try:
        before = [s for s, _ in statuses(gw, 12)]
        assert before.count(200) >= 5 and 429 in before, before
        redis.pause()  # connected, but answers nothing: the worst case
        time.sleep(1.2)  # the tokens held run out (they last a second)
        during = statuses(gw, 30)
        expected = 200 if mode == "open" else 503
        assert [s for s, _ in during] == [expected] * 30, during
        assert logged(gw, "redis", "no reply in time")
        # The time spindle itself took (its access log), for each of them: never more than the
        # Redis timeout (100ms) and a margin; and most fail at once (during the back-off).
        def written():
            lines = log.read_text().splitlines() if log.exists() else []
            return [json.loads(line) for line in lines] if len(lines) >= 42 else None
        lines = wait_until(written)
        assert lines, "the access log did not get 42 lines"
        waited = [line["duration_us"] for line in lines[12:42] if line["status"] == expected]
        assert len(waited) == 30
        assert max(waited) < 150_000, waited
        assert sorted(waited)[len(waited) // 2] < 20_000, waited
        # Back: the limit holds again.
        redis.resume()
        time.sleep(0.5)
        after = [s for s, _ in statuses(gw, 12)]
        assert 429 in after, after
    finally:
        redis.resume()
        gw.stop()
        a.stop()


def test_a_stopped_redis_fails_closed_at_once_then_the_limit_comes_back(build_dir, tmp_path):
    a = upstream(build_dir, "a")
    first = Redis(tmp_path)
    port = first.port
    gw = gateway(build_dir, tmp_path, limited(
        port, "{key: route, rate: 2/s, burst: 2, store: redis, failure_mode: closed}",
        f"{a.host}:{a.port}", extra_redis=", backoff: 200ms"))
    second = None
    try:
        assert [s for s, _ in statuses(gw, 3)] == [200, 200, 429]
        first.stop()  # refused from now on
        time.sleep(1.1)
        during = statuses(gw, 10)
        assert [s for s, _ in during] == [503] * 10, during
        assert logged(gw, "redis", "connection lost") or logged(gw, "redis", "cannot connect")
        # A new Redis on the same port: the counts start again there.
        second = Redis(tmp_path, port=port)
        time.sleep(0.3)
        assert wait_until(lambda: statuses(gw, 1)[0][0] == 200, seconds=3)
        assert 429 in [s for s, _ in statuses(gw, 4)]
    finally:
        gw.stop()
        first.stop()
        if second is not None:
            second.stop()
        a.stop()


def test_redis_with_a_password(build_dir, tmp_path):
    a = upstream(build_dir, "a")
    r = Redis(tmp_path, password="s3cret")
    good = bad = None
    try:
        (tmp_path / "good").mkdir()
        (tmp_path / "bad").mkdir()
        limit = "{key: route, rate: 2/s, burst: 2, store: redis, failure_mode: closed}"
        good = gateway(build_dir, tmp_path / "good", limited(
            r.port, limit, f"{a.host}:{a.port}", extra_redis=", password: s3cret, database: 3"))
        assert [s for s, _ in statuses(good, 3)] == [200, 200, 429]
        assert r.command("SELECT", "3") == "OK"
        bad = gateway(build_dir, tmp_path / "bad", limited(
            r.port, limit, f"{a.host}:{a.port}", extra_redis=", password: wrong"))
        assert [s for s, _ in statuses(bad, 2)] == [503, 503]
        assert logged(bad, "redis", "WRONGPASS") or logged(bad, "redis", "invalid password")
    finally:
        for gw in (good, bad):
            if gw is not None:
                gw.stop()
        r.stop()
        a.stop()


@pytest.mark.parametrize("section,why", [
    ("{address: localhost}", "redis.address: 'localhost' is not HOST:PORT"),
    ("{timeout: 50ms}", "redis.address: required (HOST:PORT)"),
    ("{address: 127.0.0.1:6379, timeout: 0ms}", "redis.timeout: must be more than 0"),
    ("{address: 127.0.0.1:6379, pool: 4}", "redis.pool: unknown key"),
])
def test_a_bad_redis_section_is_a_configuration_error(build_dir, tmp_path, section, why):
    config = tmp_path / "bad.yaml"
    config.write_text(f"""servers:
  - {{listen: 127.0.0.1:0}}
redis: {section}
""")
    err = config_error(build_dir, config)
    assert f"{config}:3: {why}" in err, err
