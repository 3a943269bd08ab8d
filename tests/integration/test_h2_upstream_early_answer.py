"""An HTTP/2 upstream that answers before it has taken the request body (issue 70, item 2): a
complete answer, then RST_STREAM(NO_ERROR) (RFC 9113 8.1; Go's net/http2 server does it whenever
a handler returns before reading the body). The client gets the answer at once, not after the
service's write timeout; the rest of the body is not sent, the request is not tried again, the
upstream connection stays (no GOAWAY, no new connection) and the streams beside it on that
connection get their answers. A reset before the answer's END_STREAM is a stream error: the
client never gets it for a whole answer. Clients over HTTP/1.1 (Content-Length and chunked) and
HTTP/2, bodies larger than every window, streamed and buffered (request_buffering)."""
import hashlib
import os
import socket
import subprocess
import threading
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest

from conftest import ROOT, Server
from proxy_support import (SERVER, ScriptedUpstream, gateway, h2_connect, h2_events_until, h2_post,
                           request, request_headers, response_head)


# Larger than Go's windows (1 MiB a stream and a connection), than the scripted upstream's
# stream window (64 KiB) and than what spindle hands a stream ahead of its window (64 KiB).
BODY = os.urandom(3 << 20)
# Far beyond the time a client here waits: an answer held until it would fail the test.
WRITE_TIMEOUT = "40s"
CLIENT_WAIT = 15
CLIENTS = ["http1", "http1-chunked", "http2"]
BUFFERING = {"streamed": "1k", "buffered": "16m"}


def early_gateway(build_dir, tmp_path, port, buffering):
    return gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off, limits: {{max_body: 64m}}}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a:
    url: "http://127.0.0.1:{port}"
    protocol: h2c
    request_buffering: {buffering}
    timeouts: {{write: {WRITE_TIMEOUT}}}
""", threads=1)


# ---- clients ----------------------------------------------------------------------------------


def http1_post(server, path, body, chunked=False):
    """POSTs `body` over HTTP/1.1 from a thread of its own (the gateway may stop reading it)
    while the response is read here: (status, body) — body None if the answer was cut."""
    s = socket.create_connection((server.host, server.port), timeout=CLIENT_WAIT)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: a\r\n{framing}\r\n\r\n".encode())

    def send():
        try:
            for at in range(0, len(body), 65536):
                piece = body[at:at + 65536]
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the gateway answered and closed: the rest is not wanted

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        head, rest = response_head(s)
        status = int(head.split(b" ")[1])
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        length = int(fields.get(b"Content-Length", b"0"))
        while len(rest) < length:
            more = s.recv(65536)
            if not more:
                return status, None
            rest += more
        return status, rest[:length]
    finally:
        s.close()
        sender.join(timeout=CLIENT_WAIT)


def post(client, server, path, body):
    if client == "http2":
        return h2_post(server, path, body, timeout=CLIENT_WAIT)
    return http1_post(server, path, body, chunked=client == "http1-chunked")


def post_sha(server, body):
    """A whole body through the gateway to the upstream's /sha: what the upstream read."""
    status, got = http1_post(server, "/sha", body)
    assert status == 200, (status, got)
    return got


def sha_line(body):
    return f"{hashlib.sha256(body).hexdigest()} {len(body)}".encode()


# ---- against Go's net/http h2c server ------------------------------------------------------


@pytest.fixture(scope="module")
def go_upstream():
    done = subprocess.run([os.path.join(ROOT, "scripts", "install-go-echo.sh")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    server = Server([os.path.join(ROOT, "build/tools/go-h2c-early")])
    yield server
    server.stop()


def go_stats(server):
    """(connections accepted, this one included; POSTs /early got), asked directly."""
    s = socket.create_connection((server.host, server.port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, request_headers("/stats"), end_stream=True)
    s.sendall(conn.data_to_send())
    got = b""
    try:
        while True:
            data = s.recv(65536)
            assert data
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    got += event.data
                if isinstance(event, h2.events.StreamEnded):
                    connections, early = got.split()
                    return int(connections), int(early)
            s.sendall(conn.data_to_send())
    finally:
        s.close()


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
@pytest.mark.parametrize("client", CLIENTS)
def test_go_answers_before_reading_and_the_client_gets_it_at_once(build_dir, tmp_path, go_upstream,
                                                                  client, buffering):
    connections_before, early_before = go_stats(go_upstream)
    gw = early_gateway(build_dir, tmp_path, go_upstream.port, BUFFERING[buffering])
    try:
        # A stream beside them on the same upstream connection: its whole body gets through.
        beside = {}
        other = threading.Thread(target=lambda: beside.update(got=post_sha(gw, BODY[::-1])))
        other.start()
        for _ in range(3):
            assert post(client, gw, "/early", BODY) == (403, b"early")
        other.join(timeout=CLIENT_WAIT * 2)
        assert beside.get("got") == sha_line(BODY[::-1])
        assert post_sha(gw, BODY) == sha_line(BODY)  # and after them
        connections, early = go_stats(go_upstream)
        # Each request reached the upstream once (no retry), all on one connection.
        assert early - early_before == 3
        assert connections - connections_before == 2  # the gateway's, and this second asking
    finally:
        gw.stop()
    assert not [line for line in gw.errors if "/early" in line], gw.errors


# ---- against a scripted HTTP/2 upstream ----------------------------------------------------


class ScriptedH2Upstream(ScriptedUpstream):
    """An h2c upstream that answers each stream as its path says, as soon as its head came:
    /answer-then-reset/CODE: 200 "ok" with END_STREAM, then RST_STREAM(CODE);
    /reset-before-end/CODE: the head (no END_STREAM), then RST_STREAM(CODE);
    /sha: reads the whole body and answers its SHA-256 and length.
    Its stream windows stay closed to the bodies of the others. Counts the requests by path and
    notes any GOAWAY it gets."""

    def __init__(self):
        self.paths = []
        self.goaways = []
        super().__init__()

    def handle(self, sock):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        conn.increment_flow_control_window(64 << 20)  # the connection: only streams are shut
        sock.sendall(conn.data_to_send())
        bodies = {}
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                for event in conn.receive_data(data):
                    self.on_event(conn, event, bodies)
                sock.sendall(conn.data_to_send())
        except OSError:
            pass
        finally:
            sock.close()

    def on_event(self, conn, event, bodies):
        if isinstance(event, h2.events.ConnectionTerminated):
            self.goaways.append(event.error_code)
        if isinstance(event, h2.events.RequestReceived):
            path = dict(event.headers)[b":path"].decode()
            self.paths.append(path)
            kind, _, code = path.strip("/").partition("/")
            sid = event.stream_id
            if kind == "answer-then-reset":
                conn.send_headers(sid, [(":status", "200"), ("content-length", "2")])
                conn.send_data(sid, b"ok", end_stream=True)
                conn.reset_stream(sid, int(code))
            elif kind == "reset-before-end":
                conn.send_headers(sid, [(":status", "200"), ("content-length", "2")])
                conn.reset_stream(sid, int(code))
            else:
                bodies[sid] = hashlib.sha256(), [0]
        elif isinstance(event, h2.events.DataReceived) and event.stream_id in bodies:
            sum, length = bodies[event.stream_id]
            sum.update(event.data)
            length[0] += len(event.data)
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        if isinstance(event, h2.events.StreamEnded) and event.stream_id in bodies:
            sum, length = bodies.pop(event.stream_id)
            answer = f"{sum.hexdigest()} {length[0]}".encode()
            conn.send_headers(event.stream_id,
                              [(":status", "200"), ("content-length", str(len(answer)))])
            conn.send_data(event.stream_id, answer, end_stream=True)


@pytest.fixture
def scripted():
    upstream = ScriptedH2Upstream()
    yield upstream
    upstream.stop()


CODES = {"NO_ERROR": h2.errors.ErrorCodes.NO_ERROR, "CANCEL": h2.errors.ErrorCodes.CANCEL,
         "INTERNAL_ERROR": h2.errors.ErrorCodes.INTERNAL_ERROR,
         "REFUSED_STREAM": h2.errors.ErrorCodes.REFUSED_STREAM,
         "STREAM_CLOSED": h2.errors.ErrorCodes.STREAM_CLOSED}


@pytest.mark.parametrize("buffering", sorted(BUFFERING))
@pytest.mark.parametrize("client", CLIENTS)
def test_a_reset_after_a_complete_answer_delivers_it(build_dir, tmp_path, scripted, client,
                                                     buffering):
    gw = early_gateway(build_dir, tmp_path, scripted.port, BUFFERING[buffering])
    try:
        beside = {}
        other = threading.Thread(target=lambda: beside.update(got=post_sha(gw, BODY[::-1])))
        other.start()
        # Whatever the code: the answer was whole, the reset only says the rest is not wanted
        # (REFUSED_STREAM too: the upstream answered, so it is not sent again).
        for name, code in CODES.items():
            assert post(client, gw, f"/answer-then-reset/{int(code)}", BODY) == (200, b"ok"), name
        other.join(timeout=CLIENT_WAIT * 2)
        assert beside.get("got") == sha_line(BODY[::-1])
        assert post_sha(gw, BODY) == sha_line(BODY)
        assert sorted(scripted.paths) == sorted(
            [f"/answer-then-reset/{int(c)}" for c in CODES.values()] + ["/sha", "/sha"])
        assert scripted.accepted == 1 and scripted.goaways == []
    finally:
        gw.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_reset_before_the_answer_ends_is_a_stream_error(build_dir, tmp_path, scripted, client):
    gw = early_gateway(build_dir, tmp_path, scripted.port, BUFFERING["streamed"])
    try:
        for name, code in CODES.items():
            path = f"/reset-before-end/{int(code)}"
            status, got = post(client, gw, path, BODY)
            # Never the head alone for a whole (empty) answer.
            assert status == 502, (name, status, got)
        assert post_sha(gw, BODY) == sha_line(BODY)
        assert scripted.accepted == 1 and scripted.goaways == []
        assert scripted.paths.count("/sha") == 1
    finally:
        gw.stop()


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
