"""HTTP/2 clients to an HTTP/1.1 upstream: what a client's fields become on the upstream's wire.
A field an HTTP/1.1 upstream would read otherwise is refused or made harmless, every byte of a
method, path or value gets the verdict HTTP/1.1 would give it, a request that cannot be written
upstream takes no target out, and a body an upstream sends where none may be (HEAD, 204, 304)
never reaches the client."""
import pytest

from h2_raw import (Client, END_HEADERS, END_STREAM, HEADERS, PROTOCOL_ERROR, ScriptedUpstream,
                    data, fetch, frame)
from h2_traffic import misbehaving
from proxy_support import gateway, one_route


# ---- HTTP/2 to HTTP/1.1: what a client's fields become on the upstream's wire -----------------


class RawH1Upstream:
    """An HTTP/1.1 upstream on a free port that records each request's head as bytes and
    answers 200 "ok" (closing)."""

    def __init__(self):
        import socket
        import threading
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.heads = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            sock.settimeout(5)
            got = b""
            try:
                while b"\r\n\r\n" not in got:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    got += chunk
                self.heads.append(got.split(b"\r\n\r\n")[0])
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n"
                             b"\r\nok")
            except OSError:
                pass
            sock.close()

    def stop(self):
        self.listener.close()


def raw_h1_gateway(build_dir, tmp_path):
    """A RawH1Upstream, and a gateway of one worker (HTTP/2 on) whose one route goes to it."""
    up = RawH1Upstream()
    gw = gateway(build_dir, tmp_path, one_route(up), threads=1)
    return up, gw


@pytest.mark.parametrize("field", [
    (":method", "GET /admin"),
    (":method", "G\tET"),
    (":path", "/a b"),
    (":path", "/a\tb"),
    (":path", "/a\x7fb"),
    (":path", "/a#frag"), (":authority", "a b"), (":authority", "a\tb"),
    ("x-a:b", "v"), ("host:evil", "v"), ("x a", "v"), ("x-a", "v\x00w"),
    ("x-a", "v\x7fw"),
    ("", "v"), ("x-a\x00", "v"), (":scheme", "http://evil/"),
], ids=["method-space", "method-tab", "path-space", "path-tab", "path-del", "path-fragment",
        "authority-space", "authority-tab", "name-colon", "name-host-colon", "name-space",
        "value-nul", "value-del", "name-empty", "name-nul", "scheme-url"])
def test_a_field_an_http1_upstream_would_read_otherwise_is_refused_or_made_harmless(
        build_dir, tmp_path, field):
    """An HTTP/2 field whose bytes would change an HTTP/1.1 request line or field (a space in
    the method or path, a colon in a name): the request is refused, or reaches the upstream
    with its request line and fields exactly those the gateway meant (one line per field, the
    request line of three parts, one Host)."""
    up, gw = raw_h1_gateway(build_dir, tmp_path)
    try:
        c = Client(gw.port)
        name, value = field
        head = {":method": "GET", ":scheme": "http", ":authority": "gateway.test",
                ":path": "/public"}
        extra = []
        if name in head:
            head[name] = value
        else:
            extra = [(name, value)]
        block = c.encoder.encode([*head.items(), *extra])
        c.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
        s = c.wait_done(1)
        if s.status() == 200:
            assert len(up.heads) == 1
            lines = up.heads[0].split(b"\r\n")
            method, target, version = lines[0].split(b" ")  # three parts, exactly
            assert version == b"HTTP/1.1" and method == b"GET", lines[0]
            assert b"admin" not in lines[0], lines[0]
            names = [line.split(b":", 1)[0].lower() for line in lines[1:]]
            assert names.count(b"host") == 1, lines
            for line in lines[1:]:
                n, _, v = line.partition(b":")
                assert n and all(33 <= ch < 127 and ch != ord(":") for ch in n), line
                assert all(ch >= 32 and ch != 127 or ch == 9 for ch in v), line
            assert b"evil" not in up.heads[0], up.heads[0]
        else:
            assert up.heads == []  # (nothing garbled went, whatever the status)
            assert s.reset is not None or s.status() in (400, 404, 405, 501), \
                (s.status(), s.reset)
    finally:
        gw.stop()
        up.stop()


def h1_status(port, request):
    """The status HTTP/1.1 gives `request` (bytes) on a new connection."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        got = b""
        while b"\r\n" not in got:
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
    assert got.startswith(b"HTTP/1.1 "), (request, got[:100])
    return int(got[9:12])


PLACES = {"method": lambda b: (b"G" + b + b"ET", b"/p", b"v"),
          "path": lambda b: (b"GET", b"/a" + b + b"b", b"v"),
          "value": lambda b: (b"GET", b"/p", b"v" + b + b"w")}


@pytest.mark.parametrize("place", sorted(PLACES))
def test_every_byte_in_a_method_path_or_value_gets_http1s_verdict_over_http2(
        build_dir, tmp_path, place):
    """Each byte 0x00-0xff inside the method, the path or a field value: HTTP/2 refuses the
    request at the edge (a stream reset PROTOCOL_ERROR, or 400) exactly when HTTP/1.1 refuses
    the same bytes (400), and answers the same status otherwise; never 502 (the upstream
    blamed for what the client sent), and nothing refused reaches the upstream."""
    up, gw = raw_h1_gateway(build_dir, tmp_path)
    try:
        c = Client(gw.port)
        differ = []
        for n in range(256):
            method, path, value = PLACES[place](bytes([n]))
            h1 = h1_status(gw.port, method + b" " + path + b" HTTP/1.1\r\nHost: gateway.test"
                           b"\r\nx-a: " + value + b"\r\n\r\n")
            before = len(up.heads)
            sid = 1 + 2 * n
            block = c.encoder.encode([(b":method", method), (b":scheme", b"http"),
                                      (b":authority", b"gateway.test"), (b":path", path),
                                      (b"x-a", value)])
            c.send(frame(HEADERS, END_HEADERS | END_STREAM, sid, block))
            s = c.wait_done(sid)
            assert c.error is None, (n, c.error)
            h2 = "refused" if s.reset == PROTOCOL_ERROR or s.status() == 400 else s.status()
            if h2 == "refused":
                assert len(up.heads) == before, (n, "a refused request went upstream")
            if h2 != ("refused" if h1 == 400 else h1):
                differ.append((hex(n), h1, h2))
        assert differ == [], differ
    finally:
        gw.stop()
        up.stop()


@pytest.mark.parametrize("protocol", ["http", "h2c"])
def test_requests_that_cannot_be_written_upstream_take_no_target_out(build_dir, tmp_path,
                                                                    protocol):
    """Requests the gateway cannot put on an HTTP/1.1 wire (a DEL in a field value, a space in
    the path: accepted by HTTP/2) fail before any byte goes: that is the client's request,
    not the target's failure. Six of them must not eject a target (passive health)."""
    if protocol == "http":
        a, b = RawH1Upstream(), RawH1Upstream()
    else:
        a = ScriptedUpstream(lambda conn, sid: conn.answer(sid, 200, b"ok"))
        b = ScriptedUpstream(lambda conn, sid: conn.answer(sid, 200, b"ok"))
    gw = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: pool}}
services:
  pool: {{upstream: pool, protocol: {protocol}}}
upstreams:
  pool:
    targets: [{{address: "127.0.0.1:{a.port}"}}, {{address: "127.0.0.1:{b.port}"}}]
    health: {{passive: {{max_fails: 3, fail_timeout: 30s, max_ejection_percent: 50}}}}
""", threads=1)
    try:
        c = Client(gw.port)
        statuses = []
        for i in range(6):
            s = c.get(1 + 2 * i, "/public", extra=[("x-a", "v\x7fw")])
            statuses.append(s.status())
        counts = []
        for up in (a, b):
            counts.append(len(up.heads) if protocol == "http" else len(up.seen))
        for i in range(10):
            assert c.get(101 + 2 * i, "/good").status() == 200
        after = [len(up.heads) if protocol == "http" else len(up.seen) for up in (a, b)]
        got = [n - m for n, m in zip(after, counts)]
        assert all(n > 0 for n in got), (statuses, got, "a target was taken out")
    finally:
        gw.stop()
        a.stop()
        b.stop()


@pytest.mark.parametrize("method,status", [("HEAD", 200), ("GET", 204), ("GET", 304)])
def test_a_body_an_upstream_sends_where_none_may_be_never_reaches_the_client(
        build_dir, tmp_path, method, status):
    """An upstream that sends DATA after a HEAD's head, a 204's or a 304's: the client gets
    the head and no body; the shared connection goes on."""
    def bad(conn, sid):
        conn.send(frame(HEADERS, END_HEADERS, sid, conn.encode(
            [(":status", str(status)), ("content-length", "5")])), data(sid, b"hello", end=True))

    up, relay, gw = misbehaving(build_dir, tmp_path, bad)
    try:
        c = Client(gw.port)
        s = c.get(1, "/bad", method=method)
        assert s.body == b"", s.body
        assert s.status() in (status, 502) or s.reset is not None
        after = fetch(gw.port, "/after")
        assert (after.status(), len(after.body)) == (200, 4000)
        assert (relay.accepted, relay.closed) == (1, 0)
    finally:
        gw.stop()
        relay.stop()
        up.stop()
