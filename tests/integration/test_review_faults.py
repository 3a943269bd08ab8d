"""An adversarial review of the gateway's promises under ordinary faults of the parts it talks
to (docs/operations.md "When things fail", docs/gateway.md): a Redis that answers absurd or
hostile replies, an auth service that answers oddly, stalls or closes, a mirror target that is
slow, down or hostile, static roots holding FIFOs or files that shrink while sent, reloads in the
middle of traffic, and clients that send bodies the gateway refused. Every attack is a test: one
that holds is a plain test, one that found a defect says so (xfail, strict) until it is fixed."""
import http.client
import os
import re
import signal
import socket
import threading
import time

import h2.events
import pytest

from proxy_support import (SERVER, RecordingUpstream, ScriptedUpstream, addr, free_port, gateway,
                           h2_connect, h2_events_until, held_dead_port, logged, read_request,
                           read_request_head, request, request_headers, wait_until)
from test_rate_limit_redis import limited, statuses

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


CLOSED = "{key: route, rate: 1000/s, burst: 1000, store: redis, failure_mode: closed, batch: 1}"


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
    gw = one_worker_limit(build_dir, tmp_path, fake.port, up, CLOSED,
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
    gw = one_worker_limit(build_dir, tmp_path, fake.port, up, CLOSED,
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
      - rate_limit: {CLOSED}
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


# ---- forward_auth: an auth service that answers oddly ---------------------------------------


class Auth(ScriptedUpstream):
    """Answers each GET with `self.reply` (bytes, or a callable of the request count); counts
    the requests it read."""

    def __init__(self, reply, close=False):
        self.reply = reply
        self.close = close
        self.asked = 0
        super().__init__()

    def handle(self, conn):
        with conn:
            data = b""
            try:
                while True:
                    got = read_request_head(conn, data)
                    if got is None:
                        return
                    data = got[1]
                    self.asked += 1
                    reply = self.reply(self.asked) if callable(self.reply) else self.reply
                    if reply is None:
                        conn.recv(1)  # stalls: never answers
                        return
                    conn.sendall(reply)
                    if self.close:
                        return
            except OSError:
                pass


def auth_config(target, auth, first_byte="2s"):
    return SERVER + f"""
routes:
  - name: free
    match: {{path_prefix: /free}}
    middlewares: [{{strip_prefix: /free}}]
    service: a
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - forward_auth: {{service: auth, path: /verify, response_headers: [X-Auth-User]}}
    service: a
services:
  a: {{url: "http://{addr(target)}"}}
  auth: {{url: "http://127.0.0.1:{auth.port}", timeouts: {{connect: 1s, first_byte: {first_byte}}}}}
"""


def test_an_early_hint_from_the_auth_service_is_not_its_answer(build_dir, tmp_path, recorder):
    auth = Auth(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nX-Auth-User: alice\r\nContent-Length: 0\r\n\r\n")
    gw = gateway(build_dir, tmp_path, auth_config(recorder, auth))
    try:
        status, _, _ = request(gw, "GET", "/x")
        assert status == 200
        head = recorder.requests[-1][0].decode().lower()
        assert "x-auth-user: alice" in head, head
    finally:
        gw.stop()
        auth.stop()


REFUSAL = (b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive, "
           b"X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nUpgrade: h2c\r\n"
           b"WWW-Authenticate: Bearer\r\n\r\n5\r\nlogin\r\n0\r\n\r\n")


def test_an_auth_refusal_reaches_an_http1_client_framed_once(build_dir, tmp_path, up):
    auth = Auth(REFUSAL)
    gw = gateway(build_dir, tmp_path, auth_config(up, auth))
    try:
        with socket.create_connection((gw.host, gw.port), timeout=5) as s:
            s.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while data.count(b"login") < 2:
                more = s.recv(65536)
                assert more, data
                data += more
        heads = [part for part in data.split(b"login") if part]
        for head in data.split(b"\r\n\r\n")[:-1:2]:
            text = head.decode().lower()
            assert text.startswith("http/1.1 401"), text
            for hop in ("transfer-encoding", "keep-alive", "x-hop", "upgrade"):
                assert hop + ":" not in text, text
            assert "www-authenticate: bearer" in text
        assert len(heads) >= 2
    finally:
        gw.stop()
        auth.stop()


def test_an_auth_refusal_reaches_an_http2_client_without_connection_fields(build_dir, tmp_path,
                                                                           up):
    auth = Auth(REFUSAL)
    gw = gateway(build_dir, tmp_path, auth_config(up, auth))
    try:
        s, conn = h2_connect(gw)
        with s:
            conn.send_headers(1, request_headers("/a"), end_stream=True)
            s.sendall(conn.data_to_send())
            events = h2_events_until(s, conn, lambda ev: any(
                isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
        got = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        assert got, events
        fields = dict(got[0].headers)
        assert fields[b":status"] == b"401"
        assert b"transfer-encoding" not in fields and b"connection" not in fields
        data = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
        assert data == b"login"
    finally:
        gw.stop()
        auth.stop()


def test_a_stalled_auth_service_holds_only_its_own_clients(build_dir, tmp_path, up):
    auth = Auth(None)
    gw = gateway(build_dir, tmp_path, auth_config(up, auth, first_byte="1500ms"), threads=1)
    try:
        held = []
        clients = [threading.Thread(target=lambda: held.append(request(gw, "GET", "/x")[0]))
                   for _ in range(4)]
        for c in clients:
            c.start()
        wait_until(lambda: auth.asked >= 1)
        for _ in range(5):
            start = time.monotonic()
            assert request(gw, "GET", "/free/plaintext")[0] == 200
            assert time.monotonic() - start < 1.0
        for c in clients:
            c.join(10)
        assert held == [503] * 4, held
    finally:
        gw.stop()
        auth.stop()


@pytest.mark.parametrize("reply,why", [
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 300_000 + b"\r\nContent-Length: 0\r\n\r\n",
     "a 300 KB field"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"b" * 100_000, "a 100 KB body"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "a broken chunk"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", "two lengths"),
    (b"HTTP/1.1 9999 Odd\r\nContent-Length: 0\r\n\r\n", "a status past 599"),
    (b"HTTP/1.1 2", "cut in its status line"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_malformed_auth_answer_is_refused_and_the_next_request_is_served(
        build_dir, tmp_path, up, reply, why):
    replies = [reply, b"HTTP/1.1 200 OK\r\nX-Auth-User: bob\r\nContent-Length: 0\r\n\r\n"]
    auth = Auth(lambda n: replies[min(n, 2) - 1], close=True)
    gw = gateway(build_dir, tmp_path, auth_config(up, auth), threads=1)
    try:
        status, _, body = request(gw, "GET", "/plaintext")
        assert status in (502, 503), (why, status, body)
        assert request(gw, "GET", "/plaintext")[0] == 200, why
    finally:
        gw.stop()
        auth.stop()


def test_an_auth_answer_cut_after_its_first_byte_is_not_sent_again(build_dir, tmp_path, up):
    # Only a GET that got no answer byte is the keep-alive race: one cut in its answer was
    # processed by the service, and is its fault (503), asked once.
    auth = Auth(b"HTTP/1.1 20", close=True)
    gw = gateway(build_dir, tmp_path, auth_config(up, auth))
    try:
        assert request(gw, "GET", "/plaintext")[0] == 503
        assert auth.asked == 1
    finally:
        gw.stop()
        auth.stop()


def smuggle_after_refusal(gw, expect):
    """Sends a POST whose body holds a whole request (after the 100-continue wait if `expect`),
    then a GET: the statuses answered on the connection, in order."""
    inner = b"GET /free/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    head = (b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(inner) +
            (b"Expect: 100-continue\r\n" if expect else b"") + b"\r\n")
    with socket.create_connection((gw.host, gw.port), timeout=5) as s:
        s.sendall(head)
        if expect:
            time.sleep(0.3)
        s.sendall(inner + b"GET /free/plaintext HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except OSError:
            pass
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


@pytest.mark.parametrize("expect", [False, True])
def test_a_body_behind_a_refusal_is_never_read_as_a_request(build_dir, tmp_path, recorder,
                                                            expect):
    auth = Auth(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
    gw = gateway(build_dir, tmp_path, auth_config(recorder, auth))
    try:
        got = smuggle_after_refusal(gw, expect)
        assert got and got[0] == 401, got
        assert not any("smuggled" in t for t in recorder.targets()), recorder.targets()
        assert len(got) <= 2, got
    finally:
        gw.stop()
        auth.stop()
