"""What a request or a tunnel holds lives as long as it does, whatever reloads happen meanwhile:
each way through the gateway is caught in flight, the configuration is reloaded twice (the
snapshot it started with is then held by it alone), and it is finished. It must finish whole,
and the gateway must exit 0 with no sanitizer report (the ASan build is what sees a snapshot
freed under a request: run these with --build build/asan too)."""
import http.client
import json
import os
import signal
import socket
import threading
import time

import h2.events
import h2.exceptions
import h2.settings
import pytest

from proxy_support import (Auth, HostileShadow, SERVER, ScriptedUpstream, addr, free_port,
                           h2_connect, h2_events_until, read_request, request_headers,
                           response_head, upstream)
from test_h2_websocket_upstream import (ended, go_ws, open_ws, send_binary, send_text,
                                        upstream as ws_upstream)
from test_protocol_upgrades import EchoServer, H2WebSocket
from test_reload import Gateway


# How long a held upstream waits for the test before it goes on regardless.
HOLD_SECONDS = 30


class Turn:
    """One request's treatment by a HeldUpstream: `first` sent as soon as the request has come
    (`arrived`), `rest` once `release` is set, then the connection closes (with nothing sent
    at all: closed before any answer)."""

    def __init__(self, first=b"", rest=b""):
        self.first, self.rest = first, rest
        self.arrived, self.release = threading.Event(), threading.Event()


class HeldUpstream(ScriptedUpstream):
    """An HTTP/1.1 upstream that treats the requests it gets, in order, as `turns` says (a list
    it may share with other HeldUpstreams: the first request to any of them takes the first
    turn). A request beyond the turns is answered 200 at once."""

    def __init__(self, turns, lock=None):
        self.turns = turns
        self.lock = lock or threading.Lock()
        super().__init__()

    def next_turn(self):
        with self.lock:
            if self.turns:
                return self.turns.pop(0)
        turn = Turn(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        turn.release.set()
        return turn

    def handle(self, conn):
        with conn:
            if read_request(conn) is None:
                return
            turn = self.next_turn()
            turn.arrived.set()
            try:
                conn.sendall(turn.first)
                turn.release.wait(HOLD_SECONDS)
                conn.sendall(turn.rest)
            except OSError:
                pass


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


# Streamed bodies: (response head, its first piece, the rest), in every framing the gateway
# streams (chunked, a length longer than the first piece, to the upstream's close) and as SSE.
STREAMED = {
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n"
                b"\r\n", chunk(b"first piece "), chunk(b"then the rest") + b"0\r\n\r\n"),
    "length": (b"HTTP/1.1 200 OK\r\nContent-Length: 25\r\nContent-Type: text/plain\r\n\r\n",
               b"first piece ", b"then the rest"),
    "close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\n\r\n",
              b"first piece ", b"then the rest"),
    "sse": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream"
            b"\r\nCache-Control: no-cache\r\n\r\n", chunk(b"data: first piece \n\n"),
            chunk(b"data: then the rest\n\n") + b"0\r\n\r\n"),
}
STREAMED_BODY = {"sse": b"data: first piece \n\ndata: then the rest\n\n"}


def config(port, version, routes, server_too=False):
    """A configuration with server "public" on `port` (HTTP/2 too) and the `routes`, services
    and upstreams text given; `version` makes each one a new configuration, its server's
    settings too if `server_too` (open connections then drain: HTTP/2 ones are told GOAWAY)."""
    name = f"v{version}" if server_too else "spindle"
    return f"""
drain_timeout: {10 + version}s
servers:
  - name: public
    listen: 127.0.0.1:{port}
    http2: true
    access_log: off
    server_name: {name}
{routes}
"""


def to(target, settings=""):
    """Every request to service s, `target` ("HOST:PORT"), with the route's further
    `settings` (YAML lines, four spaces in)."""
    return f"""
routes:
  - name: all
    match: {{path_prefix: /}}
    service: s
{settings}
services:
  s: {{url: "http://{target}", timeouts: {{idle: 10s, first_byte: 20s, read: 20s}}}}
"""


class Reloading:
    """A gateway serving `routes` that the test reloads while something is in flight."""

    def __init__(self, build_dir, tmp_path, routes):
        self.port = free_port()
        self.routes = routes
        self.version = 0
        self.gw = Gateway(build_dir, tmp_path, config(self.port, 0, routes))
        self.host = self.gw.server.host

    def reload(self, times=2, server_too=False):
        """Reloads `times` times, each to a new configuration (the same routes; new server
        settings too if `server_too`)."""
        for _ in range(times):
            self.version += 1
            self.gw.sighup(config(self.port, self.version, self.routes, server_too))

    def log(self):
        """The gateway's log so far."""
        return "".join(self.gw.server.errors)

    def finish(self):
        """Stops the gateway: it must exit 0 (a sanitizer report it wrote fails the test too:
        conftest's no_sanitizer_report)."""
        code = self.gw.stop()
        self.gw.server.error_reader.join(10)
        assert code == 0, self.log()[-3000:]


@pytest.fixture
def reloading(build_dir, tmp_path):
    """Starts a Reloading gateway (reloading(routes)); stops it at the end if the test did
    not."""
    started = []

    def start(routes):
        started.append(Reloading(build_dir, tmp_path, routes))
        return started[-1]

    yield start
    for r in started:
        r.gw.stop()


def read_until(s, data, done):
    """Reads from socket `s` onto `data` until `done(data)`; the data (as far as it came)."""
    while not done(data):
        more = s.recv(65536)
        if not more:
            break
        data += more
    return data


def echoes(s, payload):
    s.sendall(payload)
    return read_until(s, b"", lambda got: len(got) >= len(payload)) == payload


def dechunk(body):
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return out
        out += body[:size]
        body = body[size + 2:]


# ---- tunnels: HTTP/1.1 Upgrade, CONNECT, RFC 8441 over HTTP/2 ---------------------------------


@pytest.mark.parametrize("server_too", [False, True])
@pytest.mark.parametrize("reloads", [1, 2])
def test_an_http1_websocket_outlives_reloads(build_dir, reloading, reloads, server_too):
    echo = upstream(build_dir, "echo")
    try:
        r = reloading(to(addr(echo)))
        s = socket.create_connection((r.host, r.port), timeout=10)
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  b"Sec-WebSocket-Version: 13\r\n\r\n")
        head, rest = response_head(s)
        assert head.startswith(b"HTTP/1.1 101") and rest == b"", head
        assert echoes(s, b"before")
        r.reload(reloads, server_too)
        assert echoes(s, b"after the reloads")
        s.close()  # the tunnel ends, its snapshot with it
        r.finish()
    finally:
        echo.stop()


def test_a_connect_tunnel_outlives_reloads(build_dir, reloading):
    echo = upstream(build_dir, "echo")
    try:
        r = reloading(f"""
routes:
  - {{name: egress, match: {{methods: [CONNECT]}}, service: s}}
services:
  s: {{url: "http://{addr(echo)}", timeouts: {{idle: 10s}}}}
""")
        s = socket.create_connection((r.host, r.port), timeout=10)
        s.sendall(b"CONNECT backend.test:443 HTTP/1.1\r\nHost: backend.test:443\r\n\r\n")
        head, rest = response_head(s)
        assert head.startswith(b"HTTP/1.1 200") and rest == b"", head
        assert echoes(s, b"before")
        r.reload()
        assert echoes(s, b"after the reloads")
        s.close()
        r.finish()
    finally:
        echo.stop()


def test_a_websocket_over_http2_outlives_reloads(reloading):
    echo = EchoServer()
    try:
        r = reloading(to(f"127.0.0.1:{echo.port}"))
        ws = H2WebSocket(r.host, r.port)
        assert ws.status == 200, ws.events
        ws.send(b"before")
        assert ws.receive() == b"before"
        r.reload()
        ws.send(b"after the reloads")
        assert ws.receive() == b"after the reloads"
        ws.close()
        r.finish()
    finally:
        echo.stop()


def h2c_service(port):
    return f"""
routes:
  - name: all
    match: {{path_prefix: /}}
    service: s
services:
  s: {{url: "http://127.0.0.1:{port}", protocol: h2c, timeouts: {{idle: 10s}}}}
"""


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_a_websocket_on_an_h2c_upstream_stream_outlives_reloads_that_drop_its_upstream(
        build_dir, reloading, go_ws, client):
    """An upgrade to an h2c service runs on a stream of the shared upstream connection (RFC
    8441): reloads, then one that names another upstream (the connection is retired: it ends
    after its last stream), leave it running; a new WebSocket goes to the new upstream."""
    first, second = ws_upstream(go_ws), ws_upstream(go_ws)
    try:
        r = reloading(h2c_service(first.port))
        ws = open_ws(client, r)
        send_text(ws, "before")
        assert ws.receive() == b"before"
        r.reload()
        r.routes = h2c_service(second.port)
        r.reload(1)
        payload = os.urandom(300_000)
        send_binary(ws, payload)
        assert ws.receive() == payload
        send_text(ws, "info")
        assert json.loads(ws.receive())["proto"] == "HTTP/2.0"
        other = open_ws(client, r)
        send_text(other, "elsewhere")
        assert other.receive() == b"elsewhere"
        other.close()
        ws.close()
        assert [e["over"] for e in ended(first)] == ["HTTP/2.0"]
        assert [e["over"] for e in ended(second)] == ["HTTP/2.0"]
        r.finish()
    finally:
        first.stop()
        second.stop()


# ---- streamed and long-polled answers, HTTP/1.1 and HTTP/2 ----------------------------------


def h1_get(r, path):
    s = socket.create_connection((r.host, r.port), timeout=10)
    s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
    return s


def h1_body(s, data=b""):
    """The body of the response whose head starts `data` (read on from `s` to its close)."""
    data = read_until(s, data, lambda got: False)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return dechunk(body) if b"transfer-encoding: chunked" in head.lower() else body


def h2_get(r, path):
    s, conn = h2_connect(r)
    conn.send_headers(1, request_headers(path), end_stream=True)
    s.sendall(conn.data_to_send())
    return s, conn


def h2_data(events):
    return b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))


def h2_body(events):
    assert any(isinstance(e, h2.events.ResponseReceived) and (b":status", b"200") in e.headers
               for e in events), events
    return h2_data(events)


def h2_ended(events):
    return any(isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in events)


@pytest.mark.parametrize("framing", sorted(STREAMED))
@pytest.mark.parametrize("version", ["1.1", "2"])
def test_a_streamed_answer_outlives_reloads(reloading, framing, version):
    head, first, rest = STREAMED[framing]
    turn = Turn(head + first, rest)
    held = HeldUpstream([turn])
    try:
        r = reloading(to(f"127.0.0.1:{held.port}"))
        expected = STREAMED_BODY.get(framing, b"first piece then the rest")
        if version == "1.1":
            s = h1_get(r, "/stream")
            got = read_until(s, b"", lambda d: b"first piece" in d)
        else:
            s, conn = h2_get(r, "/stream")
            events = h2_events_until(s, conn, lambda ev: b"first piece" in h2_data(ev))
        assert turn.arrived.is_set()
        r.reload()  # the answer's producer now holds the only copy of its snapshot
        turn.release.set()
        if version == "1.1":
            assert h1_body(s, got) == expected
        else:
            events += h2_events_until(s, conn, h2_ended)
            assert h2_ended(events) and h2_body(events) == expected, events
        s.close()
        r.finish()
    finally:
        held.stop()


@pytest.mark.parametrize("version", ["1.1", "2"])
def test_a_long_poll_outlives_reloads(reloading, version):
    turn = Turn(b"", b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nevent!")
    held = HeldUpstream([turn])
    try:
        r = reloading(to(f"127.0.0.1:{held.port}"))
        if version == "1.1":
            s = h1_get(r, "/poll")
        else:
            s, conn = h2_get(r, "/poll")
        assert turn.arrived.wait(10)
        r.reload()  # the handler waits on the upstream with its snapshot
        turn.release.set()
        if version == "1.1":
            assert h1_body(s) == b"event!"
        else:
            events = h2_events_until(s, conn, h2_ended)
            assert h2_body(events) == b"event!", events
        s.close()
        r.finish()
    finally:
        held.stop()


# ---- retries, forward_auth, mirror --------------------------------------------------------------


def test_a_retry_and_its_streamed_answer_outlive_reloads(reloading):
    # Whichever target gets the request first holds it through two reloads, then closes
    # unanswered; the other answers, streaming, and is held through two more.
    dropped = Turn()
    answered = Turn(STREAMED["chunked"][0] + STREAMED["chunked"][1], STREAMED["chunked"][2])
    turns, lock = [dropped, answered], threading.Lock()
    a, b = HeldUpstream(turns, lock), HeldUpstream(turns, lock)
    try:
        r = reloading(f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: s}}
services:
  s: {{upstream: u, retries: {{attempts: 2, budget: 100%}}, timeouts: {{first_byte: 20s}}}}
upstreams:
  u:
    targets: [{{address: "127.0.0.1:{a.port}"}}, {{address: "127.0.0.1:{b.port}"}}]
""")
        s = h1_get(r, "/retried")
        assert dropped.arrived.wait(10)
        r.reload()
        dropped.release.set()
        assert answered.arrived.wait(10), r.log()
        got = read_until(s, b"", lambda d: b"first piece" in d)
        r.reload()
        answered.release.set()
        assert h1_body(s, got) == b"first piece then the rest"
        s.close()
        r.finish()
    finally:
        a.stop()
        b.stop()


def test_a_forward_auth_subrequest_outlives_reloads(build_dir, reloading):
    site = upstream(build_dir, "site")
    verdict = Turn(b"", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Auth-User: ann\r\n\r\n")
    auth = HeldUpstream([verdict])
    try:
        r = reloading(f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - forward_auth: {{service: auth, path: /verify, response_headers: [X-Auth-User]}}
    service: a
services:
  a: {{url: "http://{addr(site)}"}}
  auth: {{url: "http://127.0.0.1:{auth.port}", timeouts: {{first_byte: 20s}}}}
""")
        s = h1_get(r, "/headers")
        assert verdict.arrived.wait(10)
        r.reload()  # the request waits on the auth service with its snapshot
        verdict.release.set()
        assert b"x-auth-user: ann" in h1_body(s).lower()
        s.close()
        r.finish()
    finally:
        auth.stop()
        site.stop()


def test_mirror_copies_outlive_reloads(build_dir, reloading):
    # The shadow takes one copy at a time: the first is held through two reloads, the second
    # waits its turn for the connection meanwhile (in the snapshot's upstream).
    site = upstream(build_dir, "site")
    # (The first closes its connection: the second then gets a new one, not a closed one.)
    first = Turn(b"", b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    second = Turn(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    second.release.set()
    shadow = HeldUpstream([first, second])
    try:
        r = reloading(f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - mirror: {{service: shadow, timeout: 20s}}
    service: a
services:
  a: {{url: "http://{addr(site)}"}}
  shadow: {{upstream: shadow, timeouts: {{connect: 20s, first_byte: 20s}}}}
upstreams:
  shadow:
    targets: [{{address: "127.0.0.1:{shadow.port}"}}]
    limits: {{max_connections: 1, preempt_stalled: 0s}}
""")
        # Both on one connection: one worker, whose one connection to the shadow is taken.
        s = socket.create_connection((r.host, r.port), timeout=10)
        for close in (b"", b"Connection: close\r\n"):
            s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n%s\r\n" % close)
            assert first.arrived.wait(10)
        assert h1_body(s).endswith(b"Hello, World!")
        r.reload()  # the copies' fibers hold the only copies of their snapshot
        assert not second.arrived.is_set()  # it waits its turn
        first.release.set()
        assert second.arrived.wait(10), r.log()
        r.finish()  # waits for the copies (finish_mirrors) before exiting
    finally:
        shadow.stop()
        site.stop()


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
