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
import h2.exceptions
import h2.settings
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


def smuggle_after_refusal(gw, expect, chunked=False):
    """Sends a POST whose body holds a whole request (after the 100-continue wait if `expect`),
    then a GET: the statuses answered on the connection, in order."""
    inner = b"GET /free/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    framing = (b"Transfer-Encoding: chunked\r\n" if chunked
               else b"Content-Length: %d\r\n" % len(inner))
    if chunked:
        inner = b"%x\r\n%s\r\n0\r\n\r\n" % (len(inner), inner)
    head = (b"POST /a HTTP/1.1\r\nHost: x\r\n" + framing +
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


@pytest.mark.parametrize("expect,chunked", [(False, False), (True, False), (False, True),
                                            (True, True)])
def test_a_body_behind_a_refusal_is_never_read_as_a_request(build_dir, tmp_path, recorder,
                                                            expect, chunked):
    auth = Auth(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
    gw = gateway(build_dir, tmp_path, auth_config(recorder, auth))
    try:
        got = smuggle_after_refusal(gw, expect, chunked)
        assert got and got[0] == 401, got
        assert not any("smuggled" in t for t in recorder.targets()), recorder.targets()
        assert len(got) <= 2, got
    finally:
        gw.stop()
        auth.stop()


# ---- mirror: a shadow that is slow, down or hostile ----------------------------------------


class HostileShadow(ScriptedUpstream):
    """A mirror target that misbehaves as `kind` says, counting its connections open."""

    def __init__(self, kind):
        self.kind = kind
        self.open = 0
        super().__init__()

    def handle(self, conn):
        self.open += 1
        try:
            if self.kind == "stalls":  # reads nothing, answers nothing
                conn.settimeout(10)
                conn.recv(1, socket.MSG_PEEK)
                time.sleep(10)
            elif self.kind == "resets":
                read_request_head(conn)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            elif self.kind == "switches":
                read_request_head(conn)
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n"
                             b"Connection: upgrade\r\n\r\n" + b"\xff" * 65536)
                conn.recv(1)
            elif self.kind == "floods":
                read_request_head(conn)
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                while True:
                    conn.sendall(b"4000\r\n" + b"z" * 0x4000 + b"\r\n")
            elif self.kind == "holds":  # reads its requests, never answers, never closes
                while conn.recv(65536):
                    pass
        except OSError:
            pass
        finally:
            conn.close()
            self.open -= 1


def mirrored(target, shadow_address, settings="", service_settings=""):
    return SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - mirror: {{service: shadow, timeout: 1s{settings}}}
    service: a
services:
  a: {{url: "http://{addr(target)}"{service_settings}}}
  shadow: {{url: "http://{shadow_address}"}}
"""


@pytest.mark.parametrize("kind", ["refuses", "stalls", "resets", "switches", "floods"])
def test_a_hostile_shadow_changes_nothing_the_primary_or_the_client_sees(
        build_dir, tmp_path, recorder, kind):
    held = None
    if kind == "refuses":
        held, port = held_dead_port()
        shadow, shadow_address = None, f"127.0.0.1:{port}"
    else:
        shadow = HostileShadow(kind)
        shadow_address = f"127.0.0.1:{shadow.port}"
    gw = gateway(build_dir, tmp_path, mirrored(recorder, shadow_address, ", max_in_flight: 2"),
                 threads=1)
    try:
        for i in range(6):
            body = bytes([65 + i]) * 60_000
            start = time.monotonic()
            status, _, answer = request(gw, "POST", f"/p{i}", body=body)
            assert status == 200 and time.monotonic() - start < 1.0, (kind, i, status)
            assert recorder.requests[-1][1] == body, (kind, i)
        assert recorder.targets() == [f"POST /p{i} HTTP/1.1" for i in range(6)]
    finally:
        gw.stop()
        if shadow:
            shadow.stop()
        if held:
            held.close()


class HeadFirst(ScriptedUpstream):
    """Notes when each request head arrives (before its body), then reads the body and
    answers."""

    def __init__(self):
        self.heads = []
        super().__init__()

    def handle(self, conn):
        with conn:
            got = read_request_head(conn)
            if got is None:
                return
            self.heads.append(time.monotonic())
            got = read_request(conn, got[0] + b"\r\n\r\n" + got[1])
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")


# (Before 75e2cbf the mirrored case failed: the copy read the body, the head reached the
# upstream only when the client's last byte came.)
@pytest.mark.parametrize("with_mirror", [False, True, "split"])
def test_a_mirror_never_makes_a_streamed_request_wait_for_its_body(build_dir, tmp_path,
                                                                    with_mirror):
    up = HeadFirst()
    shadow = HostileShadow("holds")
    text = mirrored(up, f"127.0.0.1:{shadow.port}", service_settings=", request_buffering: 0")
    if with_mirror == "split":
        # The route's service reads bodies whole; the traffic_split's pick streams them: the
        # copy must go by the service picked.
        text = text.replace("      - mirror:", "      - traffic_split: {services: [{service: a}]}"
                            "\n      - mirror:").replace("    service: a\n", "    service: b\n")
        text += f'  b: {{url: "http://{addr(up)}"}}\n'
    if not with_mirror:
        text = text.replace("    middlewares:\n      - mirror: {service: shadow, timeout: 1s}\n",
                            "")
    gw = gateway(build_dir, tmp_path, text)
    try:
        with socket.create_connection((gw.host, gw.port), timeout=5) as s:
            s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" +
                      b"x" * 10)
            assert wait_until(lambda: up.heads, seconds=2), "the head never went upstream"
            s.sendall(b"x" * 990)
            assert response_status(s) == 200
    finally:
        gw.stop()
        shadow.stop()
        up.stop()


def response_status(s):
    data = b""
    while b"\r\n" not in data:
        more = s.recv(4096)
        if not more:
            break
        data += more
    return int(data.split()[1]) if data else None


def test_a_mirrored_expect_100_continue_gets_its_100_and_its_body_through(build_dir, tmp_path,
                                                                          recorder):
    shadow = HostileShadow("holds")
    gw = gateway(build_dir, tmp_path, mirrored(recorder, f"127.0.0.1:{shadow.port}"))
    try:
        with socket.create_connection((gw.host, gw.port), timeout=5) as s:
            s.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            assert response_status(s) == 100
            s.sendall(b"hello")
            data = b""
            while b"\r\n\r\n" not in data.partition(b"\r\n\r\n")[2] and len(data) < 4096:
                more = s.recv(4096)
                if not more:
                    break
                data += more
                if b"200 OK" in data:
                    break
            assert b"HTTP/1.1 200" in data, data
        assert recorder.requests[-1][1] == b"hello"
    finally:
        gw.stop()
        shadow.stop()


def test_an_http2_body_of_unknown_length_is_not_copied_without_it(build_dir, tmp_path, recorder):
    got = []

    class Shadow(RecordingUpstream):
        def answer(self, head, body):
            got.append((head, body))
            return b"HTTP/1.1 204 No Content\r\n\r\n"
    shadow = Shadow()
    gw = gateway(build_dir, tmp_path, mirrored(recorder, f"127.0.0.1:{shadow.port}"))
    try:
        s, conn = h2_connect(gw)
        with s:
            conn.send_headers(1, request_headers("/h2", method="POST"))
            conn.send_data(1, b"q" * 100, end_stream=True)
            s.sendall(conn.data_to_send())
            events = h2_events_until(s, conn, lambda ev: any(
                isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
        assert any(isinstance(e, h2.events.StreamEnded) for e in events), events
        assert recorder.requests[-1][1] == b"q" * 100
        time.sleep(0.3)
        # A copy, if there is one, carries the body whole.
        assert all(body == b"q" * 100 for _, body in got), got
    finally:
        gw.stop()
        shadow.stop()


def test_a_reload_that_drops_a_stalled_mirror_closes_its_connections(build_dir, tmp_path, up):
    from test_reload import Gateway
    shadow = HostileShadow("holds")
    text = mirrored(up, f"127.0.0.1:{shadow.port}")
    gw = Gateway(build_dir, tmp_path, text)
    try:
        for _ in range(6):
            assert request(gw.server, "GET", "/plaintext")[0] == 200
        assert wait_until(lambda: shadow.open >= 1)
        gw.sighup(text.replace("    middlewares:\n      - mirror: {service: shadow, timeout: 1s}\n",
                               "")
                  .replace(f'  shadow: {{url: "http://127.0.0.1:{shadow.port}"}}\n', ""))
        for _ in range(6):
            assert request(gw.server, "GET", "/plaintext")[0] == 200
        # Each copy ends within twice its timeout; then nothing of the old mirror is left.
        assert wait_until(lambda: shadow.open == 0, seconds=5), shadow.open
    finally:
        gw.stop()
        shadow.stop()


# ---- static roots: what is not a regular file, a file that shrinks while sent ---------------


def static_server(build_dir, tmp_path, root):
    from test_static_roots import serve_root
    return serve_root(build_dir, tmp_path, root)


@pytest.mark.parametrize("where", ["index", "link", "outside"])
def test_a_fifo_behind_an_index_or_a_link_is_404_at_once(build_dir, tmp_path, where):
    from test_static_roots import get
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    os.mkfifo(tmp_path / "pipe")
    if where == "index":
        os.mkfifo(root / "d" / "index.html")
        path = "/d/"
    elif where == "link":
        os.mkfifo(root / "fifo")
        os.symlink("fifo", root / "d" / "x.html")
        path = "/d/x.html"
    else:  # a link out of the root (to a FIFO, as it happens): never followed
        os.symlink(tmp_path / "pipe", root / "d" / "x.html")
        path = "/d/x.html"
    (root / "ok.txt").write_text("ok")
    server = static_server(build_dir, tmp_path, root)
    try:
        start = time.monotonic()
        # (A folder whose index is no regular file has no index: 403, as one without.)
        assert get(server, path)[0] == (403 if where == "index" else 404)
        assert get(server, "/ok.txt") == (200, b"ok")
        assert time.monotonic() - start < 2.0
    finally:
        server.stop()


def test_a_file_that_shrinks_while_sent_over_http1_ends_its_connection(build_dir, tmp_path):
    from test_static_roots import get
    root = tmp_path / "root"
    root.mkdir()
    big = root / "big.bin"
    big.write_bytes(b"b" * (16 << 20))
    (root / "ok.txt").write_text("ok")
    server = static_server(build_dir, tmp_path, root)
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(5)
        s.connect((server.host, server.port))
        s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        got = s.recv(65536)
        os.truncate(big, 1 << 20)
        start = time.monotonic()
        assert get(server, "/ok.txt") == (200, b"ok")
        assert time.monotonic() - start < 1.0
        while chunk := s.recv(65536):
            got += chunk
        s.close()
        assert len(got) < 16 << 20
    finally:
        server.stop()


def test_a_file_that_shrinks_while_sent_over_http2_resets_only_its_stream(build_dir, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    big = root / "big.bin"
    big.write_bytes(b"b" * (4 << 20))
    (root / "ok.txt").write_text("ok")
    config = tmp_path / "site.yaml"
    config.write_text(f"servers:\n  - listen: 127.0.0.1:0\n    access_log: off\n"
                      f"    http2: true\n    root: {root}\n")
    from conftest import Server
    server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                     str(config), "--threads", "1"])
    try:
        s, conn = h2_connect(server)
        with s:
            conn.send_headers(1, request_headers("/big.bin"), end_stream=True)
            s.sendall(conn.data_to_send())
            # The first window's worth (64 KiB), not acknowledged: the rest waits for room.
            h2_events_until(s, conn, lambda ev: sum(
                len(e.data) for e in ev if isinstance(e, h2.events.DataReceived)) >= 65535,
                seconds=5)
            os.truncate(big, 1000)
            conn.increment_flow_control_window(1 << 24)
            conn.increment_flow_control_window(1 << 24, stream_id=1)
            conn.send_headers(3, request_headers("/ok.txt"), end_stream=True)
            s.sendall(conn.data_to_send())
            events = h2_events_until(s, conn, lambda ev: any(
                isinstance(e, h2.events.StreamEnded) and e.stream_id == 3 for e in ev) and any(
                isinstance(e, (h2.events.StreamReset, h2.events.StreamEnded)) and
                e.stream_id == 1 for e in ev), seconds=5)
        assert any(isinstance(e, h2.events.StreamReset) and e.stream_id == 1 for e in events), \
            events
        assert b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived)
                        and e.stream_id == 3) == b"ok"
    finally:
        server.stop()


# ---- /config: secrets wherever they are used -------------------------------------------------


def test_config_hides_a_secret_aliased_into_another_place(build_dir, tmp_path, recorder):
    from test_config_redaction import shown_config
    admin = free_port()
    gw = gateway(build_dir, tmp_path, f"""servers:
  - {{name: public, listen: 127.0.0.1:0, access_log: off}}
admin: {{listen: 127.0.0.1:{admin}}}
redis: {{address: 127.0.0.1:1, password: &pw alias-s3cr3t}}
routes:
  - name: r
    match: {{path_prefix: /, headers: {{X-Key: *pw}}}}
    middlewares:
      - forward_auth: {{service: auth}}
    service: s
services:
  s: {{url: "http://{addr(recorder)}"}}
  auth: {{url: "http://{addr(recorder)}"}}
""")
    try:
        shown = shown_config(admin)
        assert shown.startswith("HTTP/1.1 200"), shown
        assert "alias-s3cr3t" not in shown, shown
        assert addr(recorder) in shown
    finally:
        gw.stop()


# ---- reloads at any moment ------------------------------------------------------------------


def test_reloads_in_a_burst_fail_no_request_through_auth_mirror_and_limits(build_dir, tmp_path,
                                                                           up):
    from test_reload import Gateway
    auth = Auth(b"HTTP/1.1 200 OK\r\nX-Auth-User: a\r\nContent-Length: 0\r\n\r\n")
    shadow = HostileShadow("holds")
    text = SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - rate_limit: {{key: client_ip, rate: 100000/s, burst: 100000}}
      - forward_auth: {{service: auth, path: /verify}}
      - mirror: {{service: shadow, timeout: 500ms}}
    service: a
services:
  a: {{url: "http://{addr(up)}"}}
  auth: {{url: "http://127.0.0.1:{auth.port}"}}
  shadow: {{url: "http://127.0.0.1:{shadow.port}"}}
"""
    gw = Gateway(build_dir, tmp_path, text)
    statuses_seen = []
    stop = threading.Event()

    def client():
        conn = http.client.HTTPConnection(gw.server.host, gw.server.port, timeout=5)
        while not stop.is_set():
            conn.request("GET", "/plaintext")
            response = conn.getresponse()
            response.read()
            statuses_seen.append(response.status)
        conn.close()

    clients = [threading.Thread(target=client) for _ in range(3)]
    try:
        for c in clients:
            c.start()
        for i in range(15):
            gw.write(text.replace("100000/s", f"{100000 + i}/s"))
            gw.server.proc.send_signal(signal.SIGHUP)
            time.sleep(0.06)
        time.sleep(0.3)
        stop.set()
        for c in clients:
            c.join(10)
        assert statuses_seen and set(statuses_seen) == {200}, set(statuses_seen)
        assert gw.server.proc.poll() is None
    finally:
        stop.set()
        gw.stop()
        auth.stop()
        shadow.stop()


# ---- fields the gateway owns: spoofed in a trailer, or left for the auth service to set -----


class RawUpstream(ScriptedUpstream):
    """Keeps every byte it receives; answers 200 once a chunked body's end came."""

    def __init__(self):
        self.data = b""
        super().__init__()

    def handle(self, conn):
        with conn:
            conn.settimeout(3)
            try:
                while chunk := conn.recv(65536):
                    self.data += chunk
                    if self.data.endswith(b"\r\n\r\n") and b"\r\n0\r\n" in self.data:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass


@pytest.mark.parametrize("auth_sets", [True, False])
def test_a_client_cannot_set_what_forward_auth_owns_in_its_head_or_its_trailers(
        build_dir, tmp_path, auth_sets):
    up = RawUpstream()
    auth = Auth(b"HTTP/1.1 200 OK\r\n" + (b"X-Auth-User: alice\r\n" if auth_sets else b"") +
                b"Content-Length: 0\r\n\r\n")
    gw = gateway(build_dir, tmp_path, auth_config(up, auth))
    try:
        with socket.create_connection((gw.host, gw.port), timeout=5) as s:
            s.sendall(b"POST /t HTTP/1.1\r\nHost: x\r\nX-Auth-User: admin\r\n"
                      b"Transfer-Encoding: chunked\r\nTrailer: X-Auth-User\r\n\r\n"
                      b"5\r\nhello\r\n0\r\nX-Auth-User: admin\r\n\r\n")
            assert response_status(s) == 200
        assert wait_until(lambda: b"\r\n0\r\n" in up.data)
        assert b"admin" not in up.data, up.data
        assert (b"x-auth-user: alice" in up.data.lower()) == auth_sets, up.data
    finally:
        gw.stop()
        auth.stop()
        up.stop()


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
    gw = gateway(build_dir, tmp_path, limited(fake.port, CLOSED, addr(up),
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
    gw = gateway(build_dir, tmp_path, limited(fake.port, CLOSED, addr(up),
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


# ---- mirror with retries: one copy per request, whatever the primary's attempts -------------


def test_a_retried_request_is_copied_once(build_dir, tmp_path):
    got = []

    class Failing(RecordingUpstream):
        def answer(self, head, body):
            return b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"

    class Counting(RecordingUpstream):
        def answer(self, head, body):
            got.append(head)
            return b"HTTP/1.1 204 No Content\r\n\r\n"

    bad, good, shadow = Failing(), RecordingUpstream(), Counting()
    gw = gateway(build_dir, tmp_path, SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - mirror: {{service: shadow}}
    service: pool
services:
  pool: {{upstream: pool, retries: {{attempts: 2}}}}
  shadow: {{url: "http://127.0.0.1:{shadow.port}"}}
upstreams:
  pool:
    balancer: round_robin
    targets: [{{address: "127.0.0.1:{bad.port}"}}, {{address: "127.0.0.1:{good.port}"}}]
""", threads=1)
    try:
        for i in range(6):
            assert request(gw, "PUT", f"/r{i}", body=b"v")[0] == 200
        assert wait_until(lambda: len(got) >= 6)
        time.sleep(0.3)
        assert len(got) == 6, got
        assert len(bad.requests) >= 1
    finally:
        gw.stop()
        for u in (bad, good, shadow):
            u.stop()


# ---- a reload while a large body streams through -------------------------------------------


def test_a_reload_in_the_middle_of_a_streamed_upload_loses_nothing(build_dir, tmp_path, up):
    from test_reload import Gateway
    text = SERVER + f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{url: "http://{addr(up)}"}}
"""
    gw = Gateway(build_dir, tmp_path, text)
    try:
        body = os.urandom(2 << 20)
        with socket.create_connection((gw.server.host, gw.server.port), timeout=10) as s:
            s.sendall(b"POST /digest HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body))
            for i in range(0, len(body), 256 << 10):
                s.sendall(body[i:i + (256 << 10)])
                if i == 512 << 10:
                    gw.sighup(text.replace("name: all", "name: all2"))
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        h = 14695981039346656037
        for byte in body:
            h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        assert data.endswith(b"%d " % len(body) + data.split()[-2] + b" %016x" % h), data[-200:]
    finally:
        gw.stop()


# ---- files a middleware names, swapped for what is no regular file ---------------------------


USERS = "alice:{SHA}qUqP5cyxm6YcTAhz05Hph5gvu9M=\n"
JWKS = '{"keys": [{"kty": "oct", "k": "' + "A" * 43 + '"}]}'


def file_config(tmp_path, kind):
    middleware = ("{basic_auth: {users_file: named}}" if kind == "users_file"
                  else "{jwt: {jwks_file: named}}")
    return f"""servers:
  - {{listen: 127.0.0.1:0, access_log: off}}
routes:
  - name: open
    match: {{path: /open}}
    middlewares: [{{respond: {{body: open}}}}]
    service: s
  - match: {{path_prefix: /}}
    middlewares: [{middleware}]
    service: s
services:
  s: {{url: "http://127.0.0.1:9"}}
"""


@pytest.mark.parametrize("kind", ["users_file", "jwks_file"])
def test_a_named_file_that_is_a_fifo_is_refused_at_once(build_dir, tmp_path, kind):
    import subprocess
    os.mkfifo(tmp_path / "named")
    config = tmp_path / "gateway.yaml"
    config.write_text(file_config(tmp_path, kind))
    done = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config",
                           str(config)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 1 and "not a regular file" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["users_file", "jwks_file"])
def test_a_reload_meeting_a_fifo_for_a_named_file_keeps_serving_and_stops_on_sigterm(
        build_dir, tmp_path, kind):
    from test_reload import Gateway
    named = tmp_path / "named"
    named.write_text(USERS if kind == "users_file" else JWKS)
    gw = Gateway(build_dir, tmp_path, file_config(tmp_path, kind), threads=1)
    try:
        assert request(gw.server, "GET", "/open")[2] == b"open"
        named.unlink()
        os.mkfifo(named)  # a deploy left a pipe where the file was
        before = len(gw.server.errors)
        gw.server.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: any("rejected" in line and "not a regular file" in line
                                      for line in gw.server.errors[before:]), seconds=5), \
            gw.server.errors[before:]
        assert request(gw.server, "GET", "/open")[2] == b"open"
        gw.server.proc.send_signal(signal.SIGTERM)
        assert gw.server.proc.wait(timeout=5) == 0
    finally:
        gw.stop(signal.SIGKILL)


# ---- an HTTP/2 client whose body was refused --------------------------------------------------


def test_a_refused_http2_body_never_starves_the_connection_of_window(build_dir, tmp_path, up):
    # Stream 1's 4.5 MiB body meets a 401 (forward_auth): what spindle does not read must be
    # given back to the connection's window (4 MiB), or stream 3 on the same connection waits
    # for ever.
    auth = Auth(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
    gw = gateway(build_dir, tmp_path, auth_config(up, auth), threads=1)
    try:
        s, conn = h2_connect(gw)
        events = h2_events_until(s, conn, lambda ev: any(
            isinstance(e, h2.events.RemoteSettingsChanged) for e in ev))
        with s:
            for stream, path, size in ((1, "/a", 9 << 19), (3, "/free/echo", 1000)):
                conn.send_headers(stream, request_headers(path, method="POST"))
                left = size
                deadline = time.monotonic() + 10
                while left and time.monotonic() < deadline:
                    while left and (room := min(conn.local_flow_control_window(stream), left,
                                                16384)) > 0:
                        conn.send_data(stream, b"x" * room, end_stream=room == left)
                        left -= room
                    s.sendall(conn.data_to_send())
                    if left:
                        s.settimeout(1)
                        data = s.recv(1 << 20)
                        assert data, "closed"
                        events += conn.receive_data(data)
                assert left == 0, f"stream {stream}: {left} bytes never sent"
            events += h2_events_until(s, conn, lambda ev: any(
                isinstance(e, h2.events.StreamEnded) and e.stream_id == 3 for e in ev),
                seconds=10)
        statuses = {e.stream_id: dict(e.headers)[b":status"] for e in events
                    if isinstance(e, h2.events.ResponseReceived)}
        assert statuses.get(1) == b"401", statuses
        assert statuses.get(3) == b"200", statuses
    finally:
        gw.stop()
        auth.stop()


# ---- the primary's own keep-alive race, a failover, a slow Redis -----------------------------


class RacingUpstream(ScriptedUpstream):
    """Answers the first request of each connection (kept alive), then closes the connection
    as the next one arrives, unanswered."""

    def __init__(self):
        self.answered = 0
        super().__init__()

    def handle(self, conn):
        with conn:
            got = read_request(conn)
            if got is None:
                return
            self.answered += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            read_request_head(conn, got[2])


@pytest.mark.parametrize("health", [True, False])
def test_the_keep_alive_race_costs_a_get_nothing_nor_the_targets_health(build_dir, tmp_path,
                                                                        health):
    # Every reused connection is closed under its request: each GET meets the race. Before,
    # 3 of 20 were 502 once the retry budget was spent (each race a budgeted retry to the other
    # target, which raced too), 9 of 20 with passive checks (each race a failure of the target).
    ups = [RacingUpstream(), RacingUpstream()]
    checks = ("    health: {passive: {max_fails: 1, fail_timeout: 30s, max_ejection_percent: 50}}"
              if health else "")
    gw = gateway(build_dir, tmp_path, SERVER + f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: pool}}
services:
  pool: {{upstream: pool}}
upstreams:
  pool:
    targets: [{", ".join(f'{{address: "127.0.0.1:{u.port}"}}' for u in ups)}]
{checks}
""", threads=1)
    try:
        for i in range(20):
            status, _, body = request(gw, "GET", f"/g{i}")
            assert (status, body) == (200, b"ok"), (i, status, list(gw.errors))
        assert not logged(gw, "failed 1 times", seconds=0.2), list(gw.errors)
        assert not logged(gw, "answered 502", seconds=0.1), list(gw.errors)
    finally:
        gw.stop()
        for u in ups:
            u.stop()


def test_a_failover_mid_traffic_fails_no_get(build_dir, tmp_path):
    from proxy_support import upstream
    a, b = upstream(build_dir, "a"), upstream(build_dir, "b")
    gw = gateway(build_dir, tmp_path, SERVER + f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: pool}}
services:
  pool: {{upstream: pool}}
upstreams:
  pool:
    targets: [{{address: "{addr(a)}"}}, {{address: "{addr(b)}"}}]
""")
    try:
        got = []
        for i in range(40):
            if i == 10:
                a.stop(signal.SIGKILL)  # the primary dies with its connections open
            got.append(request(gw, "GET", "/plaintext")[0])
        assert got == [200] * 40, got
    finally:
        gw.stop()
        a.stop()
        b.stop()


class SlowRedis(FakeRedis):
    """Answers each EVAL with one token, 300 ms late."""

    def reply(self, n):
        time.sleep(0.3)
        return pair(1, 0)


def test_a_slow_redis_backs_off_with_one_line_per_back_off(build_dir, tmp_path, up):
    fake = SlowRedis()
    gw = gateway(build_dir, tmp_path, limited(fake.port, CLOSED, addr(up),
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


def test_a_static_root_swapped_to_a_fifo_is_404_at_once_and_back_served(build_dir, tmp_path):
    from test_static_roots import get, swap, wait_for
    release = tmp_path / "release"
    release.mkdir()
    (release / "index.html").write_text("here")
    os.mkfifo(tmp_path / "pipe")
    current = tmp_path / "current"
    os.symlink(release, current)
    server = static_server(build_dir, tmp_path, current)
    try:
        assert get(server, "/") == (200, b"here")
        swap(current, tmp_path / "pipe")
        start = time.monotonic()
        assert wait_until(lambda: get(server, "/")[0] == 404, seconds=3)
        assert time.monotonic() - start < 3
        swap(current, release)
        assert wait_for(server, "/", b"here") == (200, b"here")
    finally:
        server.stop()


class CountingAuth(Auth):
    """An auth service saying yes, counting its connections open."""

    def __init__(self):
        self.open = 0
        super().__init__(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    def handle(self, conn):
        self.open += 1
        try:
            super().handle(conn)
        finally:
            self.open -= 1


def test_reloads_moving_the_auth_service_close_the_old_targets_connections(build_dir, tmp_path,
                                                                           up):
    from test_reload import Gateway
    auths = [CountingAuth(), CountingAuth()]
    gw = Gateway(build_dir, tmp_path, auth_config(up, auths[0]))
    try:
        for i in range(1, 9):
            for _ in range(4):
                assert request(gw.server, "GET", "/plaintext")[0] == 200
            assert auths[(i - 1) % 2].open >= 1
            gw.sighup(auth_config(up, auths[i % 2]))
            for _ in range(4):
                assert request(gw.server, "GET", "/plaintext")[0] == 200
            # The dropped target's idle connections close at once.
            assert wait_until(lambda: auths[(i - 1) % 2].open == 0, seconds=3), i
    finally:
        gw.stop()
        for a in auths:
            a.stop()


# ---- an HTTP/2 upstream that answers early and resets ------------------------------------------


class EarlyAnswerH2(ScriptedUpstream):
    """An h2c upstream that answers each request as its HEADERS arrive (`status`, a short
    body, END_STREAM), then resets the stream with NO_ERROR, reading none of the body (RFC 9113
    §8.1; Go's net/http2 server does this when a handler returns before reading the body)."""

    def __init__(self, status=413, body=b"too large", reset=0):
        self.status = status
        self.body = body
        self.reset = reset  # the RST_STREAM error code after the answer, None for none
        self.answered = 0
        self.paths = []
        super().__init__()

    def handle(self, sock):
        import h2.config
        import h2.connection
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        with sock:
            try:
                sock.sendall(conn.data_to_send())
                while data := sock.recv(65536):
                    for event in conn.receive_data(data):
                        if isinstance(event, h2.events.RequestReceived):
                            self.paths.append(dict(event.headers)[b":path"].decode())
                            conn.send_headers(event.stream_id, [
                                (":status", str(self.status)),
                                ("content-length", str(len(self.body)))])
                            sent = 0
                            while sent < len(self.body):  # as the window allows
                                room = min(conn.local_flow_control_window(event.stream_id),
                                           16384, len(self.body) - sent)
                                if room <= 0:
                                    break
                                conn.send_data(event.stream_id, self.body[sent:sent + room],
                                               end_stream=sent + room == len(self.body))
                                sent += room
                            if self.reset is not None:
                                conn.reset_stream(event.stream_id, error_code=self.reset)
                            self.answered += 1
                    sock.sendall(conn.data_to_send())
            except Exception:  # noqa: BLE001 (the gateway may close as it likes)
                pass


def early_config(upstream_port, threads=1):
    return SERVER + f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: h2}}
services:
  h2: {{url: "http://127.0.0.1:{upstream_port}", protocol: h2c,
        timeouts: {{write: 4s, read: 4s}}}}
"""


@pytest.mark.parametrize("size", [1 << 20, 100_000])
def test_an_http2_upstreams_early_answer_reaches_an_http1_client_at_once(build_dir, tmp_path,
                                                                         size):
    peer = EarlyAnswerH2()
    gw = gateway(build_dir, tmp_path, early_config(peer.port), threads=1)
    try:
        for _ in range(3):
            start = time.monotonic()
            status, _, body = request(gw, "POST", "/upload", body=b"u" * size, timeout=10)
            took = time.monotonic() - start
            assert (status, body) == (413, b"too large"), (status, body)
            assert took < 2.0, took
    finally:
        gw.stop()
        peer.stop()


def test_an_http2_upstreams_early_answer_reaches_an_http2_client_at_once(build_dir, tmp_path):
    peer = EarlyAnswerH2()
    gw = gateway(build_dir, tmp_path, early_config(peer.port), threads=1)
    try:
        s, conn = h2_connect(gw)
        h2_events_until(s, conn, lambda ev: any(
            isinstance(e, h2.events.RemoteSettingsChanged) for e in ev))
        start = time.monotonic()
        with s:
            conn.send_headers(1, request_headers("/upload", method="POST"))
            for _ in range(8):
                room = min(conn.local_flow_control_window(1), 16384)
                if room:
                    conn.send_data(1, b"u" * room)
            s.sendall(conn.data_to_send())
            events = h2_events_until(s, conn, lambda ev: any(
                isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) and
                e.stream_id == 1 for e in ev), seconds=8)
        got = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        assert got and dict(got[0].headers)[b":status"] == b"413", events
        assert time.monotonic() - start < 2.0
    finally:
        gw.stop()
        peer.stop()


# ---- a stalled upstream holds only its own requests ---------------------------------------------


class Stalled(ScriptedUpstream):
    """Reads requests and never answers."""

    def handle(self, conn):
        with conn:
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass


def two_services(stalled, healthy):
    return SERVER + f"""
routes:
  - {{name: stuck, match: {{path_prefix: /stuck}}, service: stuck}}
  - {{name: fine, match: {{path_prefix: /}}, service: fine}}
services:
  stuck: {{url: "http://127.0.0.1:{stalled.port}", timeouts: {{first_byte: 2500ms}}}}
  fine: {{url: "http://{addr(healthy)}"}}
"""


def test_a_stalled_upstream_holds_no_other_clients_http1_or_their_http2_streams(build_dir,
                                                                              tmp_path, up):
    stalled = Stalled()
    gw = gateway(build_dir, tmp_path, two_services(stalled, up), threads=1)
    held = []
    try:
        for _ in range(40):
            s = socket.create_connection((gw.host, gw.port), timeout=5)
            s.sendall(b"GET /stuck HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(s)
        s, conn = h2_connect(gw)
        with s:
            for stream in range(1, 60, 2):
                conn.send_headers(stream, request_headers("/stuck"), end_stream=True)
            s.sendall(conn.data_to_send())
            assert wait_until(lambda: stalled.accepted >= 40, seconds=5), stalled.accepted
            start = time.monotonic()
            for _ in range(5):
                assert request(gw, "GET", "/plaintext")[0] == 200
            # ... and a stream of the same HTTP/2 connection as the 30 held ones.
            conn.send_headers(61, request_headers("/plaintext"), end_stream=True)
            s.sendall(conn.data_to_send())
            events = h2_events_until(s, conn, lambda ev: any(
                isinstance(e, h2.events.StreamEnded) and e.stream_id == 61 for e in ev),
                seconds=3)
            assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 61
                       for e in events), events
            assert time.monotonic() - start < 2.0
    finally:
        for s in held:
            s.close()
        gw.stop()
        stalled.stop()


class RacingH2(ScriptedUpstream):
    """An h2c upstream that answers the first stream of each connection, then closes the
    connection (no GOAWAY) as the next stream's HEADERS arrive: an HTTP/2 peer's keep-alive race
    (a deploy killing it between requests)."""

    def __init__(self, fields=()):
        self.fields = list(fields)
        self.answered = 0
        super().__init__()

    def handle(self, sock):
        import h2.config
        import h2.connection
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        answered_here = 0
        with sock:
            try:
                sock.sendall(conn.data_to_send())
                while data := sock.recv(65536):
                    for event in conn.receive_data(data):
                        if isinstance(event, h2.events.RequestReceived):
                            if answered_here:
                                return  # closed under the second request
                            conn.send_headers(event.stream_id, [
                                (":status", "200"), ("content-length", "2")] + self.fields)
                            conn.send_data(event.stream_id, b"ok", end_stream=True)
                            answered_here += 1
                            self.answered += 1
                    sock.sendall(conn.data_to_send())
            except Exception:  # noqa: BLE001
                pass


@pytest.mark.parametrize("where", ["service", "forward_auth"])
def test_an_http2_peer_closing_under_a_request_costs_a_get_nothing(build_dir, tmp_path, up, where):
    peers = [RacingH2([("x-auth-user", "alice")]), RacingH2([("x-auth-user", "alice")])]
    targets = ", ".join(f'{{address: "127.0.0.1:{p.port}"}}' for p in peers)
    if where == "service":
        routes = "  - {name: all, match: {path_prefix: /}, service: h2}\n"
    else:
        routes = ("  - name: all\n    match: {path_prefix: /}\n    middlewares:\n"
                  "      - forward_auth: {service: h2, path: /verify}\n    service: a\n")
    gw = gateway(build_dir, tmp_path, SERVER + f"""
routes:
{routes}services:
  a: {{url: "http://{addr(up)}"}}
  h2: {{upstream: pool, protocol: h2c}}
upstreams:
  pool:
    targets: [{targets}]
    health: {{passive: {{max_fails: 1, fail_timeout: 30s, max_ejection_percent: 50}}}}
""", threads=1)
    try:
        for i in range(12):
            status, _, _ = request(gw, "GET", "/plaintext")
            assert status == 200, (i, status, list(gw.errors))
        assert not logged(gw, "failed 1 times", seconds=0.2), list(gw.errors)
    finally:
        gw.stop()
        for p in peers:
            p.stop()


@pytest.mark.parametrize("reset,why", [
    (8, "CANCEL"),
    (None, "no reset at all"),
])
def test_a_complete_early_answer_is_delivered_however_the_stream_ends(build_dir, tmp_path,
                                                                     reset, why):
    # Attack on the early-answer fix: the answer is whole (END_STREAM), but the upstream
    # resets with CANCEL, or never resets and never reads the body.
    peer = EarlyAnswerH2(reset=reset)
    gw = gateway(build_dir, tmp_path, early_config(peer.port), threads=1)
    try:
        start = time.monotonic()
        status, _, body = request(gw, "POST", "/upload", body=b"u" * (1 << 20), timeout=10)
        assert (status, body) == (413, b"too large"), (why, status, body)
        assert time.monotonic() - start < 2.0, why
    finally:
        gw.stop()
        peer.stop()


def test_an_early_answer_larger_than_a_window_reaches_the_client_whole(build_dir, tmp_path):
    # 40 KB of answer fit the initial window; sent then reset (NO_ERROR): none of it may be
    # lost with the reset.
    answer = bytes(range(256)) * 160
    peer = EarlyAnswerH2(status=200, body=answer)
    gw = gateway(build_dir, tmp_path, early_config(peer.port), threads=1)
    try:
        status, _, body = request(gw, "POST", "/upload", body=b"u" * (1 << 20), timeout=10)
        assert status == 200 and body == answer, (status, len(body))
    finally:
        gw.stop()
        peer.stop()


def test_the_rest_of_a_body_behind_an_early_answer_is_never_read_as_a_request(build_dir,
                                                                              tmp_path):
    # Attack on the early-answer fix: the client's keep-alive connection still carries the
    # rest of its body (holding a whole request) when the answer comes.
    peer = EarlyAnswerH2()
    gw = gateway(build_dir, tmp_path, early_config(peer.port), threads=1)
    try:
        inner = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
        body = b"u" * (1 << 20) + inner
        with socket.create_connection((gw.host, gw.port), timeout=5) as s:
            s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                      % len(body))
            try:
                s.sendall(body)
                s.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            except OSError:
                pass  # closed on us: fine, its framing could not be kept
            data = b""
            try:
                while chunk := s.recv(65536):
                    data += chunk
            except OSError:
                pass
        assert data.startswith(b"HTTP/1.1 413"), data[:100]
        assert "/smuggled" not in peer.paths, peer.paths
    finally:
        gw.stop()
        peer.stop()
