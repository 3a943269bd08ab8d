"""forward_auth under an auth service's faults: a pooled connection the service closed just as
the GET went out (the keep-alive race) is no reason to refuse a client nor to count against the
service, and a 101 to a GET that offered no upgrade never reaches the client."""
import re
import socket
import threading
import time

import h2.events
import h2.exceptions
import h2.settings
import pytest

from proxy_support import (Auth, SERVER, ScriptedUpstream, addr, auth_config, gateway, h2_connect,
                           h2_events_until, logged, read_request_head, request, request_headers,
                           wait_until)


class RacingAuth(ScriptedUpstream):
    """Answers the first GET of each connection 200 (kept alive) and closes the connection as
    the next one arrives, unanswered: what an auth service closing an idle connection does
    when spindle's request crosses its close."""

    def __init__(self):
        super().__init__()
        self.answered = 0

    def handle(self, conn):
        with conn:
            got = read_request_head(conn)
            if got is None:
                return
            self.answered += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Auth-User: alice\r\n\r\n")
            read_request_head(conn, got[1])  # the next request: closed under it


class SwitchingAuth(ScriptedUpstream):
    """Answers every GET 101 Switching Protocols, then bytes that are no HTTP."""

    def handle(self, conn):
        with conn:
            if read_request_head(conn) is None:
                return
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
                         b"Upgrade: websocket\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            conn.recv(1)


def auth_gateway(build_dir, tmp_path, target, *auths, health=""):
    targets = ", ".join(f'{{address: "127.0.0.1:{auth.port}"}}' for auth in auths)
    return gateway(build_dir, tmp_path, SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - forward_auth: {{service: auth, path: /verify, response_headers: [X-Auth-User]}}
    service: a
services:
  a: {{url: "http://{addr(target)}"}}
  auth: {{upstream: auth-pool, timeouts: {{connect: 1s, first_byte: 2s}}}}
upstreams:
  auth-pool:
    targets: [{targets}]
    {health}
""")


def h2_get(gw, path):
    """GET `path` over HTTP/2 (prior knowledge): the response's :status."""
    s, conn = h2_connect(gw)
    with s:
        conn.send_headers(1, request_headers(path), end_stream=True)
        s.sendall(conn.data_to_send())
        events = h2_events_until(s, conn, lambda ev: any(
            isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
        for e in events:
            if isinstance(e, h2.events.ResponseReceived):
                return int(dict(e.headers)[b":status"])
    return None


@pytest.mark.parametrize("client", ["http1", "http2"])
def test_a_pooled_connection_closed_under_the_auth_get_is_tried_again(
        build_dir, tmp_path, up, client):
    auths = [RacingAuth(), RacingAuth()]
    # Passive checks that take a target out at its first counted failure (logged): a race
    # booked against the service would show.
    gw = auth_gateway(build_dir, tmp_path, up, *auths,
                      health="health: {passive: {max_fails: 1, fail_timeout: 30s, "
                             "max_ejection_percent: 50}}")
    try:
        for i in range(12):
            if client == "http1":
                status, _, _ = request(gw, "GET", "/headers")
            else:
                status = h2_get(gw, "/headers")
            assert status == 200, (i, list(gw.errors))
        # Each GET after the first met a connection closed under it, then a new one.
        assert sum(auth.answered for auth in auths) == 12
        assert not logged(gw, "forward_auth", seconds=0.2), list(gw.errors)
        assert not logged(gw, "upstream auth-pool", seconds=0.2), list(gw.errors)
    finally:
        gw.stop()
        for auth in auths:
            auth.stop()


@pytest.mark.parametrize("client", ["http1", "http2"])
def test_an_auth_service_switching_protocols_is_refused_with_502(build_dir, tmp_path, up,
                                                                  client):
    auth = SwitchingAuth()
    gw = auth_gateway(build_dir, tmp_path, up, auth)
    try:
        for _ in range(3):
            if client == "http1":
                status, headers, body = request(gw, "GET", "/")
                assert status == 502, (status, body)
                assert b"switched protocols" in body
            else:
                assert h2_get(gw, "/") == 502
        assert logged(gw, "forward_auth", "101", "answered 502")
    finally:
        gw.stop()
        auth.stop()


# ---- forward_auth: an auth service that answers oddly ---------------------------------------


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
