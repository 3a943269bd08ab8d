"""An adversarial review of spindle's HTTP/2 (issue: h2-review): raw clients that send any
frame in any order, and scripted upstreams, against a gateway of one worker whose service
reaches its upstream over one shared h2c connection. Each test is one attack; the promises
checked: another client's stream in flight on the shared upstream connection still gets its
whole answer, the upstream connection is the first one and never closed, windows are never
lost, what a stream sends ends as RFC 9113 says, and no client's value is indexed for
another. Cases that found a defect are marked xfail(strict) with what was observed."""
import struct
import time

import pytest

from h2_raw import (CANCEL, COMPRESSION_ERROR, CONTINUATION, END_HEADERS, END_STREAM,
                    ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, GOAWAY, HEADER_TABLE_SIZE, HEADERS,
                    INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS, MAX_FRAME_SIZE, NO_ERROR,
                    PROTOCOL_ERROR, REFUSED_STREAM, STREAM_CLOSED, Client,
                    ScriptedUpstream, data, fetch, frame, ping, priority, rst, settings,
                    window_update)
from h2_traffic import CountingRelay
from proxy_support import gateway, upstream

# An upstream that lets a gateway reset as many streams as its clients cancel, and keeps an
# idle connection a minute (as test_h2_shared_upstream.py).
PATIENT = {"H2_RESET_LIMITS": "100000", "KEEPALIVE_MS": "60000"}


def gateway_to(build_dir, tmp_path, port, server_extra="", service_extra=""):
    """A gateway of one worker whose service reaches 127.0.0.1:`port` over one h2c
    connection at most; `server_extra`/`service_extra`: more YAML (flow style, leading comma)."""
    return gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off{server_extra}}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{upstream: pool, protocol: h2c{service_extra}}}
upstreams:
  pool:
    targets: [{{address: "127.0.0.1:{port}"}}]
    limits: {{max_connections: 1}}
""", threads=1)


class Shared:
    """spindle's test server behind a counting relay, a gateway to it, and a victim: a client
    whose download is in flight on the shared upstream connection while the attack runs."""

    def __init__(self, build_dir, tmp_path, server_extra=", limits: {max_body: 64m}",
                 service_extra=""):
        self.up = upstream(build_dir, "a", env=PATIENT)
        self.relay = CountingRelay(self.up.port)
        self.gw = gateway_to(build_dir, tmp_path, self.relay.port, server_extra, service_extra)
        self.port = self.gw.port
        self.victim = None

    def start_victim(self, size=1_000_000):
        """A download that takes its first window's worth and then waits (its windows shut)."""
        self.victim_size = size
        self.victim = Client(self.port, auto_window=False)
        self.victim.send(self.victim.head(1, f"/bytes/{size}"))
        assert self.victim.wait(lambda: len(self.victim.stream(1).body) >= 65535), \
            "the victim's first window did not come"

    def check_victim(self, seconds=20):
        """The victim's download ends whole; a new request is answered; the upstream connection
        is still the first one."""
        if self.victim is not None:
            v = self.victim
            v.auto_window = True
            v.send(window_update(0, 1 << 30), window_update(1, 1 << 30))
            s = v.wait_done(1, seconds)
            assert (s.status(), len(s.body), s.ended, s.reset) == \
                (200, self.victim_size, True, None), "the victim's download"
        after = fetch(self.port, "/bytes/100000")
        assert (after.status(), len(after.body), after.ended) == (200, 100000, True)
        assert (self.relay.accepted, self.relay.closed) == (1, 0), "the shared connection"

    def stop(self):
        if self.victim is not None:
            self.victim.close()
        self.gw.stop()
        self.relay.stop()
        self.up.stop()


@pytest.fixture
def shared(build_dir, tmp_path):
    s = Shared(build_dir, tmp_path)
    yield s
    s.stop()


def goaway_code(c, seconds=10):
    c.wait(lambda: c.goaway is not None, seconds)
    return None if c.goaway is None else c.goaway[1]


# ---- flow control -----------------------------------------------------------------------------


def test_a_connection_window_past_2_31_ends_that_connection_only(shared):
    shared.start_victim()
    c = Client(shared.port)
    c.get(1, "/bytes/1000")
    c.send(window_update(0, 0x7FFFFFFF), window_update(0, 0x7FFFFFFF))
    assert goaway_code(c) == FLOW_CONTROL_ERROR
    shared.check_victim()


def test_a_stream_window_past_2_31_resets_that_stream_only(shared):
    shared.start_victim()
    c = Client(shared.port, auto_window=False)
    c.send(c.head(1, "/bytes/1000000"), c.head(3, "/bytes/1000"))
    c.wait(lambda: len(c.stream(1).body) > 0)
    c.send(window_update(1, 0x7FFFFFFF))
    s = c.wait_done(1)
    assert s.reset == FLOW_CONTROL_ERROR
    c.send(window_update(0, 1 << 20))
    assert c.wait_done(3).ended and c.goaway is None
    shared.check_victim()


def test_a_zero_initial_window_then_settings_reopen_it_and_the_answer_comes_whole(shared):
    """SETTINGS_INITIAL_WINDOW_SIZE 0 before the request, a larger value later: the windows of
    the streams open by the difference (RFC 9113 §6.9.2); nothing is lost."""
    shared.start_victim()
    c = Client(shared.port, settings_pairs=[(INITIAL_WINDOW_SIZE, 0)])
    c.send(c.head(1, "/bytes/300000"))
    c.wait(lambda: c.stream(1).heads, 5)
    time.sleep(0.3)
    assert c.stream(1).body == b""
    c.send(settings((INITIAL_WINDOW_SIZE, 65535)), window_update(0, 1 << 20))
    s = c.wait_done(1)
    assert (s.status(), len(s.body), s.ended) == (200, 300000, True)
    shared.check_victim()


def test_a_window_made_negative_by_settings_mid_answer_comes_back(shared):
    """The client lowers SETTINGS_INITIAL_WINDOW_SIZE below what a stream has already had (its
    window goes negative, §6.9.2), then opens it again with WINDOW_UPDATE."""
    c = Client(shared.port, auto_window=False)
    c.send(c.head(1, "/bytes/500000"))
    c.wait(lambda: len(c.stream(1).body) >= 65535)
    c.send(settings((INITIAL_WINDOW_SIZE, 1000)))
    time.sleep(0.2)
    c.auto_window = True
    c.send(window_update(0, 1 << 24), window_update(1, 70000))
    s = c.wait_done(1, 20)
    assert (s.status(), len(s.body), s.ended) == (200, 500000, True)
    shared.check_victim()


def test_uploads_reset_before_and_after_their_answers_lose_no_window(shared):
    """Twenty 200 KB uploads, each reset at a different point (before its DATA, after some,
    after the whole); then a 6 MB upload on the same connection goes through: the connection's
    window (4 MiB) was given back for every byte of the reset ones."""
    c = Client(shared.port)
    chunk = b"u" * 16384
    for i in range(20):
        sid = 1 + 2 * i
        c.send(c.head(sid, "/digest", method="POST", end=False))
        for n in range(12):
            if n == i % 13:
                c.send(rst(sid))
                break
            c.send(data(sid, chunk))
        else:
            c.send(rst(sid))
    sid = 41
    c.send(c.head(sid, "/digest", method="POST", end=False))
    assert c.upload(sid, b"v" * 6_000_000), "the upload's windows stayed shut"
    s = c.wait_done(sid, 30)
    assert s.status() == 200 and s.body.startswith(b"6000000 "), (s.status(), s.body)
    shared.check_victim()


def test_data_past_the_stream_window_is_that_streams_error(build_dir, tmp_path):
    """An upstream that opens no window: the gateway stops reading the client's body, whose
    stream window (256 KiB) then shuts; DATA past it is that stream's error only."""
    up = ScriptedUpstream(lambda conn, sid: None, auto_window=False)
    gw = gateway_to(build_dir, tmp_path, up.port, ", limits: {max_body: 64m}")
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/upload", method="POST", end=False))
        big = b"x" * 16384
        for _ in range(40):  # 640 KiB: past the stream window and what the gateway buffers
            c.send(data(1, big))
        s = c.wait_done(1)
        assert s.reset == FLOW_CONTROL_ERROR, s.reset
        assert c.goaway is None
    finally:
        gw.stop()
        up.stop()


# ---- stream states (RFC 9113 §5.1) -------------------------------------------------------------


def test_data_after_end_stream_is_stream_closed(shared):
    shared.start_victim()
    c = Client(shared.port)
    c.send(c.head(1, "/delay/300"), data(1, b"late"))
    s = c.wait_done(1)
    assert s.reset == STREAM_CLOSED
    assert c.get(3, "/bytes/10").ended
    shared.check_victim()


@pytest.mark.parametrize("frames,code", [
    (lambda c: [rst(5)], PROTOCOL_ERROR),  # RST_STREAM on an idle stream
    (lambda c: [window_update(7, 1)], PROTOCOL_ERROR),  # WINDOW_UPDATE on an idle stream
    (lambda c: [data(9, b"x")], PROTOCOL_ERROR),  # DATA on an idle stream
    (lambda c: [c.head(2, "/bytes/1")], PROTOCOL_ERROR),  # an even stream
    (lambda c: [c.head(1, "/bytes/1")], STREAM_CLOSED),  # stream 1 again, once it ended
    (lambda c: [frame(CONTINUATION, END_HEADERS, 1, b"")], PROTOCOL_ERROR),
    (lambda c: [data(0, b"x")], PROTOCOL_ERROR),  # DATA on stream 0
    (lambda c: [settings((MAX_FRAME_SIZE, 100))], PROTOCOL_ERROR),
    (lambda c: [frame(HEADERS, END_HEADERS | END_STREAM, 3, b"\xff\xff\xff\xff")],
     COMPRESSION_ERROR),  # an index past the tables
    (lambda c: [frame(HEADERS, END_HEADERS | END_STREAM, 3, b"\x3f\xe1\x7f")],
     COMPRESSION_ERROR),  # a table size update past SETTINGS_HEADER_TABLE_SIZE
    (lambda c: [window_update(0, 0)], PROTOCOL_ERROR),  # an increment of 0, connection
    (lambda c: [settings((2, 2))], PROTOCOL_ERROR),  # ENABLE_PUSH 2
    (lambda c: [settings((INITIAL_WINDOW_SIZE, 1 << 31))], FLOW_CONTROL_ERROR),
    (lambda c: [frame(4, 1, 0, b"\0" * 6)], 6),  # SETTINGS ACK with a payload: FRAME_SIZE
    (lambda c: [frame(6, 0, 0, b"1234567")], 6),  # PING of 7 bytes
    (lambda c: [frame(3, 0, 1, b"\0\0\0")], 6),  # RST_STREAM of 3 bytes
    (lambda c: [frame(8, 0, 0, b"\0\0\0")], 6),  # WINDOW_UPDATE of 3 bytes
    (lambda c: [frame(6, 0, 1, b"12345678")], PROTOCOL_ERROR),  # PING on a stream
    (lambda c: [frame(4, 0, 1, b"")], PROTOCOL_ERROR),  # SETTINGS on a stream
    (lambda c: [frame(HEADERS, END_HEADERS | 0x8, 3, b"\x05ab")], PROTOCOL_ERROR),  # pad > len
], ids=["rst-idle", "window-idle", "data-idle", "even", "reused", "continuation-alone",
        "data-0", "frame-size", "hpack-index", "hpack-size-update", "window-0", "push-2",
        "window-2-31", "settings-ack-payload", "ping-7", "rst-3", "window-update-3",
        "ping-stream", "settings-stream", "padding-too-long"])
def test_connection_errors_end_that_connection_only(shared, frames, code):
    shared.start_victim()
    c = Client(shared.port)
    assert c.get(1, "/bytes/100").ended
    c.send(*frames(c))
    assert goaway_code(c) == code
    assert c.wait(lambda: c.closed, 5)
    shared.check_victim()


def test_priority_frames_on_idle_streams_cost_nothing_and_self_dependency_resets(shared):
    shared.start_victim()
    c = Client(shared.port)
    c.send(*[priority(1001 + 2 * i, 0) for i in range(5000)])
    c.send(c.head(1, "/delay/300", end=True), priority(1, 1))
    s = c.wait_done(1)
    assert s.reset == PROTOCOL_ERROR
    assert c.get(3, "/bytes/10").status() == 200
    assert c.goaway is None
    shared.check_victim()


def test_streams_past_max_concurrent_are_refused_and_their_data_costs_no_window(shared):
    c = Client(shared.port)
    for i in range(100):
        c.send(c.head(1 + 2 * i, "/delay/1000"))
    # The 101st and more: refused; their bodies (sent anyway) must not cost the connection's
    # window.
    for i in range(100, 130):
        sid = 1 + 2 * i
        c.send(c.head(sid, "/digest", method="POST", end=False))
        c.upload(sid, b"r" * 16384 * 8)
    for i in range(100, 130):
        assert c.wait_done(1 + 2 * i).reset == REFUSED_STREAM
    for i in range(100):
        assert c.wait_done(1 + 2 * i).status() == 200
    sid = 301
    c.send(c.head(sid, "/digest", method="POST", end=False))
    assert c.upload(sid, b"w" * 5_000_000), "the upload's windows stayed shut"
    s = c.wait_done(sid, 30)
    assert s.status() == 200 and s.body.startswith(b"5000000 "), (s.status(), s.body)
    shared.check_victim()


# ---- malformed requests (RFC 9113 §8.1.1, §8.2) ------------------------------------------------


@pytest.mark.parametrize("extra,pseudo", [
    ([("Authorization", "x")], None),  # an upper-case name
    ([("connection", "keep-alive")], None),
    ([("transfer-encoding", "chunked")], None),
    ([("te", "gzip")], None),
    ([("keep-alive", "1")], None),
    ([("upgrade", "websocket")], None),
    ([("x-a", "1"), (":path", "/again")], None),  # a pseudo-field after a field, and twice
    ([(":status", "200")], None),
    ([(":protocol", "websocket")], None),  # :protocol without CONNECT
    ([("x-a", "a\r\nx-b: b")], None),  # CR LF in a value
    ([("x-a", " padded")], None),  # leading white space
], ids=["upper", "connection", "te-chunked", "te-gzip", "keep-alive", "upgrade", "late-pseudo",
        "status", "protocol-get", "crlf", "leading-space"])
def test_malformed_requests_are_reset_and_never_forwarded(build_dir, tmp_path, extra, pseudo):
    seen = []

    def script(conn, sid):
        seen.append(conn.stream(sid).heads[0])
        conn.answer(sid, 200, b"ok")

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        c = Client(gw.port)
        s = c.get(1, "/x", extra=extra)
        assert s.reset == PROTOCOL_ERROR or s.status() == 400, (s.reset, s.status())
        assert seen == []
        assert c.get(3, "/ok").status() == 200
        assert len(seen) == 1
    finally:
        gw.stop()
        up.stop()


def test_request_trailers_with_a_pseudo_field_or_without_end_stream_reset_the_stream(
        build_dir, tmp_path):
    got = []

    def script(conn, sid):
        conn.wait(lambda: conn.stream(sid).done(), 5)
        got.append((conn.stream(sid).body, conn.stream(sid).ended, conn.stream(sid).reset))
        conn.answer(sid, 200, b"ok")

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/up", method="POST", end=False), data(1, b"abc"),
               frame(HEADERS, END_HEADERS | END_STREAM, 1, c.encode([(":path", "/x")])))
        assert c.wait_done(1).reset == PROTOCOL_ERROR
        c.send(c.head(3, "/up", method="POST", end=False), data(3, b"abc"),
               frame(HEADERS, END_HEADERS, 3, c.encode([("x-t", "1")])))
        assert c.wait_done(3).reset == PROTOCOL_ERROR
        time.sleep(0.5)
        # What reached the upstream of either: never a whole request.
        assert all(not ended for _, ended, _ in got), got
    finally:
        gw.stop()
        up.stop()


# ---- a body cut short must not reach the upstream as a whole one -------------------------------


def recording_upstream():
    """A scripted upstream that waits for each request to end (or be reset), notes
    (path, body, ended by END_STREAM, reset code) and answers 200 if it ended."""
    record = []

    def script(conn, sid):
        s = conn.stream(sid)
        conn.wait(lambda: s.done(), 30)
        record.append((s.field(":path"), s.body, s.ended, s.reset))
        if s.ended and s.reset is None:
            conn.answer(sid, 200, b"got %d" % len(s.body))

    return ScriptedUpstream(script), record


@pytest.mark.parametrize("how", ["short", "long", "long-split", "rst", "close", "goaway"])
def test_a_request_body_cut_short_never_reaches_the_upstream_as_whole(build_dir, tmp_path, how):
    """content-length 100000 with fewer bytes and END_STREAM, or more; a body reset, or whose
    connection closes or ends with GOAWAY half-way: the upstream sees its stream reset, never
    ended as if the body were whole (that would be a truncated request taken as complete)."""
    up, record = recording_upstream()
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/upload", method="POST", end=False,
                      extra=[("content-length", "100000")]))
        piece = b"p" * 16384
        for _ in range(4):
            c.send(data(1, piece))
        time.sleep(0.3)  # the gateway has forwarded what came
        if how == "short":
            c.send(data(1, b"end", end=True))
        elif how == "long":
            c.send(data(1, b"q" * 40000, end=True))
        elif how == "long-split":
            c.send(data(1, b"q" * 34464), data(1, b"more"))
        elif how == "rst":
            c.send(rst(1, CANCEL))
        elif how == "close":
            c.close()
        else:
            c.send(frame(GOAWAY, 0, 0, struct.pack(">II", 0, PROTOCOL_ERROR)))
            time.sleep(0.2)
            c.close()
        deadline = time.monotonic() + 10
        while not record and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(record) == 1, record
        path, body, ended, reset = record[0]
        assert not ended, f"the upstream took a {len(body)}-byte body as whole"
        assert reset is not None
    finally:
        gw.stop()
        up.stop()


# ---- timeouts: every stream ends ---------------------------------------------------------------


def test_a_body_that_stops_coming_ends_its_stream_by_the_body_timeout(build_dir, tmp_path):
    up, record = recording_upstream()
    gw = gateway_to(build_dir, tmp_path, up.port, ", timeouts: {body: 1s}")
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/upload", method="POST", end=False), data(1, b"some"))
        s = c.wait_done(1, 10)
        assert s.status() == 408 or s.reset is not None, (s.status(), s.reset)
        deadline = time.monotonic() + 5
        while not record and time.monotonic() < deadline:
            time.sleep(0.05)
        # Kept by the gateway (request buffering) or reset upstream: never ended there.
        assert all(not ended for _, _, ended, _ in record), record
        assert c.get(3, "/x", method="POST").status() == 200  # the connection goes on
    finally:
        gw.stop()
        up.stop()


def test_a_header_block_left_unfinished_ends_the_connection_by_the_header_timeout(build_dir,
                                                                               tmp_path):
    shared = Shared(build_dir, tmp_path, server_extra=", timeouts: {header: 1s}")
    try:
        shared.start_victim()
        c = Client(shared.port)
        assert c.get(1, "/bytes/1").ended  # (the SETTINGS exchanged: no frame may cut in)
        block = c.encode([(":method", "GET"), (":scheme", "http"), (":authority", "a"),
                          (":path", "/bytes/1")])
        c.send(frame(HEADERS, END_STREAM, 3, block[:5]))
        assert c.wait(lambda: c.closed, 10)
        assert c.goaway is not None and c.goaway[1] == NO_ERROR
        shared.check_victim()
    finally:
        shared.stop()


def test_an_upstream_that_never_answers_costs_its_client_the_first_byte_timeout_only(
        build_dir, tmp_path):
    def script(conn, sid):
        if conn.stream(sid).field(":path") == "/ok":
            conn.answer(sid, 200, b"ok")
        # else: never

    up = ScriptedUpstream(script)
    relay = CountingRelay(up.port)
    gw = gateway_to(build_dir, tmp_path, relay.port, service_extra=", timeouts: {first_byte: 1s}")
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/never"))
        s = c.wait_done(1, 10)
        assert s.status() == 504, (s.status(), s.reset)
        assert c.get(3, "/ok").status() == 200
        conn = up.connections[0]
        assert conn.wait(lambda: conn.stream(1).reset is not None, 5) == True  # noqa: E712
        assert (relay.accepted, relay.closed) == (1, 0)
    finally:
        gw.stop()
        relay.stop()
        up.stop()


def test_an_upstream_that_stops_mid_body_cuts_its_client_by_the_read_timeout(build_dir,
                                                                             tmp_path):
    def script(conn, sid):
        if conn.stream(sid).field(":path") == "/ok":
            conn.answer(sid, 200, b"ok")
        else:
            conn.answer(sid, 200, b"half", fields=[("content-length", "100")], end=False)

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port, service_extra=", timeouts: {read: 1s}")
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/stall"))
        s = c.wait_done(1, 10)
        assert s.status() == 200 and s.reset is not None and not s.ended, (s.status(), s.reset)
        assert c.get(3, "/ok").status() == 200
    finally:
        gw.stop()
        up.stop()


# ---- an upstream that misbehaves costs only its own stream -------------------------------------


def misbehaving(build_dir, tmp_path, bad, service_extra=""):
    """A scripted upstream answering /bad with `bad(conn, sid)` and anything else whole; behind
    a counting relay and a gateway."""
    def script(conn, sid):
        if conn.stream(sid).field(":path").startswith("/bad"):
            bad(conn, sid)
        else:
            conn.answer(sid, 200, b"fine" * 1000)

    up = ScriptedUpstream(script)
    relay = CountingRelay(up.port)
    gw = gateway_to(build_dir, tmp_path, relay.port, service_extra=service_extra)
    return up, relay, gw


def block(conn, fields, sensitive=()):
    return conn.encode(fields, sensitive)


BAD_ANSWERS = {
    "connection-field": lambda conn, sid: conn.answer(sid, 200, b"x",
                                                      fields=[("connection", "close")]),
    "upper-case-name": lambda conn, sid: conn.answer(sid, 200, b"x", fields=[("X-Up", "1")]),
    "no-status": lambda conn, sid: conn.send(frame(
        HEADERS, END_HEADERS | END_STREAM, sid, block(conn, [("x-a", "1")]))),
    "status-twice": lambda conn, sid: conn.send(frame(
        HEADERS, END_HEADERS | END_STREAM, sid, block(conn, [(":status", "200"),
                                                             (":status", "204")]))),
    "length-short": lambda conn, sid: conn.answer(sid, 200, b"12345",
                                                  fields=[("content-length", "10")]),
    "length-long": lambda conn, sid: conn.answer(sid, 200, b"1234567890ab",
                                                 fields=[("content-length", "10")]),
    "data-before-head": lambda conn, sid: conn.send(data(sid, b"x", end=True)),
    "trailers-with-pseudo": lambda conn, sid: conn.send(
        frame(HEADERS, END_HEADERS, sid, block(conn, [(":status", "200")])), data(sid, b"x"),
        frame(HEADERS, END_HEADERS | END_STREAM, sid, block(conn, [(":status", "200")]))),
    "trailers-without-end": lambda conn, sid: conn.send(
        frame(HEADERS, END_HEADERS, sid, block(conn, [(":status", "200")])), data(sid, b"x"),
        frame(HEADERS, END_HEADERS, sid, block(conn, [("x-t", "1")]))),
    "101-on-h2": lambda conn, sid: conn.answer(sid, 101, fields=[("upgrade", "websocket")]),
    "status-600": lambda conn, sid: conn.answer(sid, 600, b"x"),
    "rst-internal": lambda conn, sid: conn.send(rst(sid, 2)),
    "data-past-window": lambda conn, sid: past_the_window(conn, sid),
}


def past_the_window(conn, sid):
    """The stream's window filled, a pause (the gateway's client reads nothing: no window comes
    back), then a frame more than the window has."""
    conn.send(frame(HEADERS, END_HEADERS, sid, block(conn, [(":status", "200")])))
    while conn.send_window(sid) > 0:
        n = min(16384, conn.send_window(sid))
        conn.send_windows[sid] -= n
        conn.send(data(sid, b"w" * n))
    time.sleep(0.5)
    more = conn.send_window(sid) + 1000
    while more > 0:
        conn.send(data(sid, b"w" * min(16384, more), end=more <= 16384))
        more -= 16384


@pytest.mark.parametrize("bad", list(BAD_ANSWERS))
def test_a_malformed_upstream_answer_is_its_clients_502_and_no_one_elses(build_dir, tmp_path,
                                                                          bad):
    up, relay, gw = misbehaving(build_dir, tmp_path, BAD_ANSWERS[bad])
    try:
        victim = Client(gw.port)
        victim.send(victim.head(1, "/fine"))
        # (A client whose windows are shut: the gateway reads no more than they let through.)
        c = Client(gw.port, settings_pairs=[(INITIAL_WINDOW_SIZE, 0)])
        c.send(c.head(1, "/bad"))
        c.wait(lambda: c.stream(1).heads or c.stream(1).done(), 5)
        time.sleep(1)  # (past-the-window: its pause, while the windows stay shut)
        c.send(settings((INITIAL_WINDOW_SIZE, 1 << 20)), window_update(0, 1 << 24))
        s = c.wait_done(1)
        # A 502, or (the head passed on already) a reset: never a whole answer.
        assert s.status() == 502 or (s.reset is not None and not s.ended), \
            (s.status(), s.reset, s.ended, s.body[:100])
        v = victim.wait_done(1)
        assert (v.status(), len(v.body)) == (200, 4000)
        after = fetch(gw.port, "/after")
        assert (after.status(), len(after.body)) == (200, 4000)
        assert (relay.accepted, relay.closed) == (1, 0)
    finally:
        gw.stop()
        relay.stop()
        up.stop()


def test_an_upstream_that_refuses_a_stream_has_it_sent_again(build_dir, tmp_path):
    """REFUSED_STREAM: nothing was processed; the request goes to the other target."""
    tries = []

    def bad(conn, sid):
        tries.append(sid)
        if len(tries) == 1:
            conn.send(rst(sid, REFUSED_STREAM))
        else:
            conn.answer(sid, 200, b"second")

    up, relay, _ = misbehaving(build_dir, tmp_path, bad)
    other = CountingRelay(up.port)
    gw = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{upstream: pool, protocol: h2c}}
upstreams:
  pool:
    targets: [{{address: "127.0.0.1:{relay.port}"}}, {{address: "127.0.0.1:{other.port}"}}]
""")
    try:
        for _ in range(10):  # (the retry budget is a share of the requests)
            assert fetch(gw.port, "/ok").status() == 200
        s = fetch(gw.port, "/bad")
        assert (s.status(), s.body) == (200, b"second")
        assert len(tries) == 2
    finally:
        gw.stop()
        relay.stop()
        other.stop()
        up.stop()


def test_an_upstream_goaway_sends_the_unprocessed_requests_again_on_a_new_connection(
        build_dir, tmp_path):
    """The upstream's first connection says GOAWAY(last 0) when the first request comes; every
    request (processed by none) is answered on the next connection."""
    def script(conn, sid):
        up = conn.upstream
        if conn is up.connections[0]:
            time.sleep(0.2)  # the others' requests arrive too
            conn.send(frame(GOAWAY, 0, 0, struct.pack(">II", 0, NO_ERROR)))
            time.sleep(0.5)
            conn.close()
        else:
            conn.answer(sid, 200, b"again")

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        clients = [Client(gw.port) for _ in range(5)]
        for c in clients:
            c.send(c.head(1, "/x"))
        for c in clients:
            s = c.wait_done(1, 15)
            assert (s.status(), s.body) == (200, b"again")
    finally:
        gw.stop()
        up.stop()


def test_an_early_answer_then_rst_no_error_ends_the_upload_and_loses_no_window(build_dir,
                                                                              tmp_path):
    """RFC 9113 §8.1: the upstream answers before the body came whole, then stops the body
    with RST_STREAM(NO_ERROR). The client gets the answer at once (not after a timeout); the
    rest of its upload costs its connection no window: a second upload on it goes through."""
    def script(conn, sid):
        if conn.stream(sid).field(":path") == "/early":
            conn.answer(sid, 200, b"early")
            conn.send(rst(sid, NO_ERROR))
        else:
            s = conn.stream(sid)
            conn.wait(lambda: s.done(), 30)
            conn.answer(sid, 200, b"got %d" % len(s.body))

    up = ScriptedUpstream(script)
    relay = CountingRelay(up.port)
    gw = gateway_to(build_dir, tmp_path, relay.port, ", limits: {max_body: 64m}",
                    ", timeouts: {write: 20s}")
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/early", method="POST", end=False))
        start = time.monotonic()
        c.upload(1, b"e" * 3_000_000, seconds=15)
        s = c.wait_done(1, 15)
        assert (s.status(), s.body) == (200, b"early")
        assert s.ended
        assert time.monotonic() - start < 10, "the early answer waited for the write timeout"
        c.send(c.head(3, "/late", method="POST", end=False))
        assert c.upload(3, b"l" * 3_000_000), "the second upload's windows stayed shut"
        s = c.wait_done(3, 20)
        assert (s.status(), s.body) == (200, b"got 3000000")
        assert (relay.accepted, relay.closed) == (1, 0)
    finally:
        gw.stop()
        relay.stop()
        up.stop()


def test_an_upstream_window_of_zero_then_opened_by_settings_lets_the_upload_through(
        build_dir, tmp_path):
    def script(conn, sid):
        time.sleep(0.3)
        conn.send(settings((INITIAL_WINDOW_SIZE, 65535)))
        s = conn.stream(sid)
        conn.wait(lambda: s.done(), 30)
        conn.answer(sid, 200, b"got %d" % len(s.body))

    up = ScriptedUpstream(script, settings_pairs=((MAX_CONCURRENT_STREAMS, 100),
                                                  (INITIAL_WINDOW_SIZE, 0)))
    gw = gateway_to(build_dir, tmp_path, up.port, ", limits: {max_body: 64m}")
    try:
        s = fetch(gw.port, "/up", method="POST", body=b"z" * 200_000)
        assert (s.status(), s.body) == (200, b"got 200000")
    finally:
        gw.stop()
        up.stop()


def hpack_integer(n, prefix=7):
    """`n` as an HPACK integer of a `prefix`-bit prefix (RFC 7541 §5.1), the flags 0."""
    if n < (1 << prefix) - 1:
        return bytes([n])
    out, n = [(1 << prefix) - 1], n - ((1 << prefix) - 1)
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    return bytes(out + [n])


@pytest.mark.parametrize("frames", [10, 33, 34, 100, 1000])
def test_an_oversized_upstream_head_costs_only_its_own_stream(build_dir, tmp_path, frames):
    """A client asks for something the upstream answers with a head of 160 KB (10 frames) to
    16 MB (1,000 frames) (an upstream that reflects what it was sent, say): that stream fails;
    another client's request in flight on the same upstream connection must still get its
    answer, and a request after it too, whose answer names entries the oversized head added
    to the HPACK table (at its start and its end: the table still in step)."""
    release = []

    def script(conn, sid):
        path = conn.stream(sid).field(":path")
        if path == "/bad":
            # As an upstream writes it: HEADERS and CONTINUATIONs within the gateway's
            # SETTINGS_MAX_FRAME_SIZE (16 KiB; one larger frame is a connection error, §4.2).
            # "x-first" and "x-late" indexed (by the connection's encoder), and between them
            # literals of 4,000 bytes not indexed, written here (hpack's encoder would take
            # minutes over 16 MB).
            parts = [conn.encode([(":status", "200"), ("x-first", "f")])]
            size = len(parts[0])
            while size <= (frames - 1) * 16384:
                name = b"x-big-%d" % len(parts)
                parts.append(b"\x00" + hpack_integer(len(name)) + name + hpack_integer(4000) +
                             b"~" * 4000)
                size += len(parts[-1])
            block = b"".join(parts) + conn.encode([("x-late", "l")])
            assert (len(block) + 16383) // 16384 == frames
            pieces = [block[at:at + 16384] for at in range(0, len(block), 16384)]
            conn.send(frame(HEADERS, 0, sid, pieces[0]),
                      *[frame(CONTINUATION, END_HEADERS if n == len(pieces) - 1 else 0, sid, p)
                        for n, p in enumerate(pieces) if n > 0],
                      data(sid, b"x", end=True))
            release.append(True)
        else:
            deadline = time.monotonic() + 5
            while not release and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)
            conn.answer(sid, 200, b"fine", fields=[("x-late", "l")])

    up = ScriptedUpstream(script)
    relay = CountingRelay(up.port)
    gw = gateway_to(build_dir, tmp_path, relay.port)
    try:
        victim = Client(gw.port)
        victim.send(victim.head(1, "/victim"))
        time.sleep(0.3)
        c = Client(gw.port)
        s = c.get(1, "/bad")
        assert s.status() == 502 or s.reset is not None
        v = victim.wait_done(1)
        assert (v.status(), v.body) == (200, b"fine"), (v.status(), v.body)
        after = victim.get(3, "/after")
        assert (after.status(), after.body) == (200, b"fine")
        assert after.field("x-late") == "l"
        assert (relay.accepted, relay.closed) == (1, 0)
    finally:
        gw.stop()
        relay.stop()
        up.stop()


# ---- HPACK ------------------------------------------------------------------------------------


def test_a_client_table_size_of_zero_then_more_is_followed_by_the_gateways_encoder(shared):
    """SETTINGS_HEADER_TABLE_SIZE 0: no response block may add to the client's table (a size
    update to 0 first); later 4096 again, then 64: each block decodes against the size said."""
    c = Client(shared.port, settings_pairs=[(HEADER_TABLE_SIZE, 0)])
    c.decoder.max_allowed_table_size = 0
    c.decoder.header_table_size = 0  # (what the decoder assumes we acknowledged)
    for sid in (1, 3):
        s = c.get(sid, "/bytes/10")
        assert s.status() == 200 and c.error is None, c.error
        assert len(c.decoder.header_table.dynamic_entries) == 0
    c.send(settings((HEADER_TABLE_SIZE, 4096)))
    c.decoder.max_allowed_table_size = 4096
    time.sleep(0.2)
    for sid in (5, 7):
        assert c.get(sid, "/bytes/10").status() == 200 and c.error is None, c.error
    c.send(settings((HEADER_TABLE_SIZE, 64)))
    time.sleep(0.2)
    c.decoder.max_allowed_table_size = 64
    for sid in (9, 11):
        s = c.get(sid, "/bytes/10")
        assert s.status() == 200 and c.error is None, c.error
        assert c.decoder.header_table.maxsize <= 64
    shared.check_victim()


def test_credentials_go_never_indexed_both_ways_and_no_value_enters_the_shared_table(
        build_dir, tmp_path):
    """A client sends its credentials with incremental indexing (as h2 clients do), and the
    upstream its Set-Cookie so: each goes on never indexed, and the upstream's table of the
    shared connection holds no credential."""
    seen = []

    def script(conn, sid):
        s = conn.stream(sid)
        seen.append({n: never for n, _, never in s.heads[0]})
        conn.answer(sid, 200, b"ok", fields=[("set-cookie", "sid=upstream-secret"),
                                             ("x-plain", "v")])

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        for who in ("alice", "bobby"):
            c = Client(gw.port)
            s = c.get(1, "/x", extra=[("authorization", f"Bearer {who}-token"),
                                      ("x-api-key", f"{who}-key"),
                                      ("proxy-authorization", f"Basic {who}")])
            assert s.status() == 200
            assert s.never_indexed("set-cookie"), s.heads
            c.close()
        for fields in seen:
            for name in ("authorization", "x-api-key"):
                assert fields.get(name) is True, fields
            assert "proxy-authorization" not in fields or fields["proxy-authorization"]
        table = " ".join(bytes(v).decode()
                         for _, v in up.connections[0].decoder.header_table.dynamic_entries)
        for secret in ("alice", "bobby"):
            assert secret not in table, table
    finally:
        gw.stop()
        up.stop()


def test_an_hpack_bomb_costs_its_stream_and_the_connection_goes_on(shared):
    shared.start_victim()
    c = Client(shared.port)
    big = "b" * 2000
    # One 2 KB entry in the table, then a block that names it 400 times (800 KB decoded).
    first = c.encode([(":method", "GET"), (":scheme", "http"), (":authority", "a"),
                      (":path", "/bytes/1"), ("x-bomb", big)])
    c.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, first))
    assert c.wait_done(1).status() == 200
    index = bytes([0x80 | 62])  # the newest dynamic entry: x-bomb
    block = c.encode([(":method", "GET"), (":scheme", "http"), (":authority", "a"),
                      (":path", "/bytes/1")]) + index * 400
    c.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, block))
    s = c.wait_done(3)
    assert s.status() == 431 or s.reset is not None, (s.status(), s.reset)
    assert c.get(5, "/bytes/10").status() == 200
    shared.check_victim()


# ---- floods ------------------------------------------------------------------------------------


@pytest.mark.parametrize("flood", ["settings", "empty-data", "continuation", "empty-headers",
                                   "rst-of-reset"])
def test_floods_end_that_connection_only(shared, flood):
    shared.start_victim()
    c = Client(shared.port)
    assert c.get(1, "/bytes/1").ended
    if flood == "settings":
        c.send(*[settings((INITIAL_WINDOW_SIZE, 65535))] * 5000)
    elif flood == "empty-data":
        c.send(c.head(3, "/digest", method="POST", end=False), *[data(3, b"")] * 5000)
    elif flood == "continuation":
        c.send(frame(HEADERS, 0, 3, c.encode([(":method", "GET")])),
               *[frame(CONTINUATION, 0, 3, b"\x40\x01a\x01b")] * 20000)
    elif flood == "empty-headers":
        c.send(frame(HEADERS, 0, 3, b""), *[frame(CONTINUATION, 0, 3, b"")] * 5000)
    else:
        # Streams opened and reset at once, by the thousand (Rapid Reset).
        frames = []
        for i in range(3000):
            sid = 3 + 2 * i
            frames += [c.head(sid, "/bytes/100000"), rst(sid)]
        c.send(*frames)
    code = goaway_code(c, 20)
    assert code in (ENHANCE_YOUR_CALM, PROTOCOL_ERROR), (flood, c.goaway)
    shared.check_victim()


def test_a_ping_flood_from_a_client_that_reads_nothing_is_bounded(build_dir, tmp_path):
    """PINGs whose answers the client never reads (CVE-2019-9512): the gateway stops reading
    (or ends the connection once its unread output passes its bound), and ends the connection
    by its write timeout; everyone else goes on."""
    import socket
    from h2_raw import PREFACE
    shared = Shared(build_dir, tmp_path, server_extra=", timeouts: {write: 2s}")
    try:
        sock = socket.create_connection(("127.0.0.1", shared.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(20)
        sock.sendall(PREFACE + settings())
        closed = False
        # PINGs until the gateway ends the connection or stops reading (a send then blocks for
        # the socket's 20 s): bounded by time, not by a count, as a slow gateway's receive
        # buffer (up to tcp_rmem's 32 MiB) may take a whole count before it has read any.
        end = time.monotonic() + 60
        try:
            while time.monotonic() < end:
                sock.sendall(ping() * 2000)
        except OSError:
            closed = True  # reset by the gateway, or it stopped reading for 20 s
        sock.close()
        assert closed
        shared.check_victim()
    finally:
        shared.stop()


def test_rapid_reset_of_a_running_upload_costs_no_one_else(shared):
    shared.start_victim()
    c = Client(shared.port)
    for wave in range(5):
        frames = []
        for i in range(60):
            sid = 1 + 2 * (wave * 60 + i)
            frames += [c.head(sid, "/digest", method="POST", end=False), data(sid, b"x" * 1000)]
        c.send(*frames)
        time.sleep(0.1)
        c.send(*[rst(1 + 2 * (wave * 60 + i)) for i in range(60)])
    time.sleep(0.5)
    shared.check_victim()


# ---- RFC 8441 extended CONNECT ----------------------------------------------------------------


def websocket_gateway(build_dir, tmp_path):
    up = upstream(build_dir, "ws", env={"KEEPALIVE_MS": "60000"})
    gw = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{url: "http://127.0.0.1:{up.port}"}}
""", threads=1)
    return up, gw


def ws_head(c, sid, extra=(), end=False, path="/ws"):
    fields = [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
              (":authority", "gateway.test"), (":path", path),
              ("sec-websocket-version", "13"), *extra]
    return frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, c.encode(fields))


def test_a_websocket_over_http2_echoes_and_a_reset_tunnel_costs_the_connection_nothing(
        build_dir, tmp_path):
    up, gw = websocket_gateway(build_dir, tmp_path)
    try:
        c = Client(gw.port)
        c.send(ws_head(c, 1))
        c.wait(lambda: c.stream(1).heads or c.stream(1).done())
        assert c.stream(1).status() == 200, (c.stream(1).heads, c.stream(1).reset)
        c.send(data(1, b"hello"))
        assert c.wait(lambda: c.stream(1).body == b"hello")
        # A second tunnel and a plain request share the connection; the first is reset.
        c.send(ws_head(c, 3))
        c.wait(lambda: c.stream(3).heads)
        c.send(rst(1, CANCEL), data(3, b"three"))
        assert c.wait(lambda: c.stream(3).body == b"three")
        assert c.get(5, "/plaintext").status() == 200
        c.send(data(3, b"", end=True))
        assert c.wait_done(3).ended or c.stream(3).reset is not None
        assert c.goaway is None
    finally:
        gw.stop()
        up.stop()


@pytest.mark.parametrize("case", ["no-path", "get-with-protocol"])
def test_malformed_extended_connects_are_refused(build_dir, tmp_path, case):
    up, gw = websocket_gateway(build_dir, tmp_path)
    try:
        c = Client(gw.port)
        if case == "end-stream":
            c.send(ws_head(c, 1, end=True))
        elif case == "no-path":
            c.send(frame(HEADERS, END_HEADERS, 1, c.encode([
                (":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
                (":authority", "gateway.test")])))
        elif case == "get-with-protocol":
            c.send(frame(HEADERS, END_HEADERS, 1, c.encode([
                (":method", "GET"), (":protocol", "websocket"), (":scheme", "http"),
                (":authority", "gateway.test"), (":path", "/ws")])))
        else:
            c.send(ws_head(c, 1, extra=[("content-length", "5")]))
        s = c.wait_done(1, 5)
        # Never a 200 that the client takes for a tunnel.
        assert s.status() != 200, (case, s.heads)
        assert s.reset is not None or s.status() >= 400, (case, s.heads, s.reset)
        assert c.get(3, "/plaintext").status() == 200
    finally:
        gw.stop()
        up.stop()


def test_tunnel_data_past_the_stream_window_resets_only_the_tunnel(build_dir, tmp_path):
    """The client's tunnel window opens only as the upstream takes the bytes; a client that
    sends past it (while its peer does not read the echo) gets its stream reset."""
    up, gw = websocket_gateway(build_dir, tmp_path)
    try:
        c = Client(gw.port, settings_pairs=[(INITIAL_WINDOW_SIZE, 0)], auto_window=False)
        c.send(ws_head(c, 1))
        c.wait(lambda: c.stream(1).heads)
        for _ in range(200):  # 3.2 MB, never reading the echo
            if not c.send(data(1, b"z" * 16384)):
                break
        s = c.wait_done(1, 20)
        assert s.reset == FLOW_CONTROL_ERROR, s.reset
        assert c.goaway is None
    finally:
        gw.stop()
        up.stop()


# ---- the upload direction of a shared upstream connection -----------------------------------


def test_uploads_an_upstream_has_not_read_yet_do_not_stall_another_clients_upload(build_dir,
                                                                                 tmp_path):
    """An upstream whose handler reads a body only later (Go's and nghttp2's servers give the
    connection's window back as their handlers read): one client's uploads to such a path fill
    the shared connection's send window; another client's upload to a path read at once must
    still go through."""
    def script(conn, sid):
        s = conn.stream(sid)
        if s.field(":path") == "/later":
            conn.wait(lambda: s.done(), 30)  # reads (gives back) nothing until it ends
            return
        conn.wait(lambda: s.done(), 30)
        conn.answer(sid, 200, b"got %d" % len(s.body))

    # Go's server: 1 MiB windows, each given back as the handler reads (here: /later's never
    # while the test runs).
    up = ScriptedUpstream(script, settings_pairs=((MAX_CONCURRENT_STREAMS, 1000),
                                                  (INITIAL_WINDOW_SIZE, 1 << 20)),
                          connection_window=1 << 20,
                          gives_back=lambda conn, sid: conn.stream(sid).field(":path") != "/later")
    gw = gateway_to(build_dir, tmp_path, up.port, ", limits: {max_body: 64m}")
    try:
        attacker = Client(gw.port)
        for i in range(2):
            sid = 1 + 2 * i
            attacker.send(attacker.head(sid, "/later", method="POST", end=False))
            attacker.upload(sid, b"a" * 1_000_000, end=False, seconds=5)
        time.sleep(0.5)
        s = fetch(gw.port, "/now", method="POST", body=b"v" * 200_000, seconds=15)
        assert (s.status(), s.body) == (200, b"got 200000"), (s.status(), s.body)
    finally:
        gw.stop()
        up.stop()


def test_requests_reset_while_waiting_for_room_on_the_upstream_connection_are_never_sent(
        build_dir, tmp_path):
    """The upstream allows 2 streams at once and holds each a second: a client's 20 requests
    wait for room on the shared connection; it resets the 18 waiting. None of those may reach
    the upstream later (their client is gone: a request sent for nobody, a POST's effect), and
    another client's request waiting behind them gets its answer."""
    def script(conn, sid):
        if conn.stream(sid).field(":path").startswith("/hold"):
            time.sleep(1)
        conn.answer(sid, 200, b"ok")

    up = ScriptedUpstream(script, settings_pairs=((MAX_CONCURRENT_STREAMS, 2),))
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        c = Client(gw.port)
        c.send(*[c.head(1 + 2 * i, f"/hold/{i}") for i in range(20)])
        deadline = time.monotonic() + 5
        while len(up.seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        held = {conn.stream(sid).field(":path") for conn, sid in list(up.seen)}
        waiting = [1 + 2 * i for i in range(20) if f"/hold/{i}" not in held]
        c.send(*[rst(sid) for sid in waiting])
        victim = fetch(gw.port, "/victim", seconds=20)
        assert (victim.status(), victim.body) == (200, b"ok")
        time.sleep(1.5)
        paths = [conn.stream(sid).field(":path") for conn, sid in list(up.seen)]
        sent_for_nobody = [p for p in paths if p.startswith("/hold") and p not in held]
        assert sent_for_nobody == [], sent_for_nobody
    finally:
        gw.stop()
        up.stop()


def test_an_upstream_table_size_of_zero_is_followed_by_the_gateways_encoder(build_dir,
                                                                           tmp_path):
    """The upstream's SETTINGS_HEADER_TABLE_SIZE 0: no block on the shared connection adds to
    its table (an entry added would be lost, and a later reference to it undecodable)."""
    def script(conn, sid):
        conn.answer(sid, 200, b"ok")

    up = ScriptedUpstream(script, settings_pairs=((MAX_CONCURRENT_STREAMS, 100),
                                                  (HEADER_TABLE_SIZE, 0)))
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        c = Client(gw.port)
        c.get(1, "/first")  # the connection made, SETTINGS exchanged
        conn = up.connections[0]
        conn.decoder.max_allowed_table_size = 0
        conn.decoder.header_table_size = 0
        for sid in range(3, 23, 2):
            s = c.get(sid, "/again", extra=[("accept", "text/html"),
                                            ("accept-language", "fr"),
                                            ("content-type", "text/plain")])
            assert s.status() == 200, (sid, s.status(), s.reset)
        assert conn.error is None and not conn.closed, conn.error
        assert len(conn.decoder.header_table.dynamic_entries) == 0
    finally:
        gw.stop()
        up.stop()


def test_an_early_413_while_the_client_uploads_loses_no_window(build_dir, tmp_path):
    """A body past max_body is answered 413 while the client still sends it; the rest of it
    costs the connection no window: a second upload on the connection goes through."""
    up, record = recording_upstream()
    gw = gateway_to(build_dir, tmp_path, up.port, ", limits: {max_body: 100k}")
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/big", method="POST", end=False))
        c.upload(1, b"b" * 5_000_000, seconds=10)
        s = c.wait_done(1, 10)
        assert s.status() == 413, (s.status(), s.reset)
        c.send(c.head(3, "/small", method="POST", end=False))
        assert c.upload(3, b"s" * 90_000), "the second upload's windows stayed shut"
        s = c.wait_done(3, 10)
        assert (s.status(), s.body) == (200, b"got 90000")
    finally:
        gw.stop()
        up.stop()


@pytest.mark.parametrize("where", ["head", "interim", "trailers"])
def test_an_upstream_field_sent_never_indexed_reaches_the_client_never_indexed(build_dir,
                                                                            tmp_path, where):
    """RFC 7541 §6.2.3: an intermediary passes a never-indexed field on as one; the docs say
    a message with one goes on never indexed whole. In a final head, a 103's, or trailers."""
    def script(conn, sid):
        secret = [("x-secret", "s3cret")]
        if where == "interim":
            conn.send(frame(HEADERS, END_HEADERS, sid, conn.encode(
                [(":status", "103"), ("link", "</a.css>"), *secret], sensitive=("x-secret",))))
            conn.answer(sid, 200, b"ok")
        elif where == "trailers":
            conn.send(frame(HEADERS, END_HEADERS, sid, conn.encode([(":status", "200")])),
                      data(sid, b"ok"),
                      frame(HEADERS, END_HEADERS | END_STREAM, sid,
                            conn.encode([("grpc-status", "0"), *secret],
                                        sensitive=("x-secret",))))
        else:
            conn.answer(sid, 200, b"ok", fields=secret, sensitive=("x-secret",))

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        c = Client(gw.port)
        s = c.get(1, "/x", extra=[("te", "trailers")])
        assert s.status() == 200 and s.ended
        assert s.field("x-secret") == "s3cret", s.heads
        assert s.never_indexed("x-secret"), s.heads
    finally:
        gw.stop()
        up.stop()



def test_padded_frames_both_ways_lose_no_window(build_dir, tmp_path):
    """Padding is flow-controlled and nobody reads it: both ends must give it back. A 3 MB
    upload from the client and a 3 MB answer from the upstream, every DATA frame padded with
    255 bytes (and the request's HEADERS padded and with a priority), go through whole."""
    def script(conn, sid):
        s = conn.stream(sid)
        conn.wait(lambda: s.done(), 30)
        conn.send(frame(HEADERS, END_HEADERS, sid, conn.encode(
            [(":status", "200"), ("x-got", str(len(s.body)))])))
        conn.upload(sid, b"d" * 3_000_000, pad=255)

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port, ", limits: {max_body: 64m}")
    try:
        c = Client(gw.port)
        block = c.encode([(":method", "POST"), (":scheme", "http"), (":authority", "a"),
                          (":path", "/padded")])
        c.send(frame(HEADERS, END_HEADERS | 0x8 | 0x20, 1,
                     bytes([10]) + struct.pack(">IB", 0, 200) + block + b"\0" * 10))
        assert c.upload(1, b"u" * 3_000_000, pad=255), "the padded upload's windows stayed shut"
        s = c.wait_done(1, 30)
        assert (s.status(), s.field("x-got"), len(s.body), s.ended) == \
            (200, "3000000", 3_000_000, True), (s.status(), s.reset, len(s.body))
    finally:
        gw.stop()
        up.stop()


@pytest.mark.parametrize("piece", [7, 100])
def test_a_head_in_many_continuations_is_one_head(shared, piece):
    """A head cut into CONTINUATIONs (within max_header_frames, 32) is one head."""
    c = Client(shared.port)
    block = c.encode([(":method", "GET"), (":scheme", "http"), (":authority", "gateway.test"),
                      (":path", "/bytes/10"), *[(f"x-f{i}", "v" * 5) for i in range(15)]])
    pieces = [block[at:at + piece] for at in range(0, len(block), piece)]
    assert len(pieces) <= 32
    frames = [frame(HEADERS, END_STREAM, 1, pieces[0])]
    frames += [frame(CONTINUATION, 0, 1, p) for p in pieces[1:-1]]
    frames.append(frame(CONTINUATION, END_HEADERS, 1, pieces[-1]))
    c.send(*frames)
    s = c.wait_done(1)
    assert (s.status(), len(s.body)) == (200, 10), (s.status(), s.reset, c.goaway)
    shared.check_victim()


def test_a_request_head_larger_than_the_upstream_allows_costs_only_its_own_stream(build_dir,
                                                                                 tmp_path):
    """The gateway allows heads of 200 KB (max_header_size); its upstream (spindle's own
    server, max_head 4 KiB) announces SETTINGS_MAX_HEADER_LIST_SIZE 4 KiB and takes a block past
    80 KB as a connection error. One client's 120 KB head must cost that request only (a 431
    from the gateway, or the upstream's answer), not the shared connection with another
    client's download on it."""
    shared = Shared(build_dir, tmp_path,
                    server_extra=", limits: {max_body: 64m, max_header_size: 200k}")
    try:
        shared.start_victim()
        c = Client(shared.port)
        # Values that do not compress (Huffman): 120 KB on the wire too.
        import random
        rng = random.Random(7)
        fields = [(f"x-big-{i}", "".join(rng.choice("!#$%&'*+-.^_`|~0123456789")
                                         for _ in range(10000))) for i in range(12)]
        s = c.get(1, "/bytes/10", extra=fields)
        # (Without the rule, the gateway sent it and the upstream ended the shared connection
        # with GOAWAY ENHANCE_YOUR_CALM: the victim's download was reset part-way.)
        assert s.status() == 431, (s.status(), s.reset)
        shared.check_victim()
        # A head just within what the upstream takes still goes.
        s = c.get(3, "/bytes/10", extra=[("x-mid", "m" * 2000)])  # (it takes 4 KiB)
        assert (s.status(), len(s.body)) == (200, 10)
    finally:
        shared.stop()


def test_an_upstream_that_answers_no_ping_does_not_stop_other_clients_requests(build_dir,
                                                                              tmp_path):
    """The gateway counts a stream it reset as open until the upstream answered a PING sent
    after the reset. An upstream that never answers PINGs (a middlebox that drops them): one
    client resets 150 streams on it (its SETTINGS_MAX_CONCURRENT_STREAMS is 100); other
    clients' requests must still be served (on that connection, or another)."""
    def script(conn, sid):
        if conn.stream(sid).field(":path").startswith("/hold"):
            time.sleep(2)
        conn.answer(sid, 200, b"ok")

    up = ScriptedUpstream(script, settings_pairs=((MAX_CONCURRENT_STREAMS, 100),))
    from h2_raw import PING as PING_KIND, UpstreamConnection
    original = UpstreamConnection._on_frame

    def deaf(self, kind, flags, sid, payload):
        if kind == PING_KIND and not flags & 1:
            return  # no answer
        original(self, kind, flags, sid, payload)

    UpstreamConnection._on_frame = deaf
    gw = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{upstream: pool, protocol: h2c, timeouts: {{write: 5s}}}}
upstreams:
  pool:
    targets: [{{address: "127.0.0.1:{up.port}"}}]
""", threads=1)
    try:
        c = Client(gw.port)
        for wave in range(3):
            base = 1 + 2 * 50 * wave
            c.send(*[c.head(base + 2 * i, f"/hold/{wave}/{i}") for i in range(50)])
            time.sleep(0.3)
            c.send(*[rst(base + 2 * i) for i in range(50)])
        time.sleep(0.3)
        s = fetch(gw.port, "/victim", seconds=15)
        assert (s.status(), s.body) == (200, b"ok"), (s.status(), s.body)
    finally:
        UpstreamConnection._on_frame = original
        gw.stop()
        up.stop()


def test_a_preface_sent_a_byte_at_a_time_ends_by_the_header_timeout(build_dir, tmp_path):
    import socket
    from h2_raw import PREFACE
    shared = Shared(build_dir, tmp_path, server_extra=", timeouts: {header: 1s}")
    try:
        sock = socket.create_connection(("127.0.0.1", shared.port))
        sock.settimeout(10)
        start = time.monotonic()
        closed = False
        try:
            for byte in PREFACE:
                sock.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            closed = True
        if not closed:
            try:
                closed = sock.recv(100) == b"" or True
            except OSError:
                closed = True
        assert closed and time.monotonic() - start < 9
        sock.close()
        shared.check_victim()
    finally:
        shared.stop()


@pytest.mark.parametrize("settings_value,ok", [("AAMAAABkAAQAAP__", True), ("AAMAAABk", False),
                                               ("!!!", False), ("", True)])
def test_an_h2c_upgrade_with_any_http2_settings_is_answered_or_refused_cleanly(
        shared, settings_value, ok):
    import socket
    sock = socket.create_connection(("127.0.0.1", shared.port), timeout=10)
    sock.sendall(b"GET /bytes/10 HTTP/1.1\r\nHost: gateway.test\r\nConnection: Upgrade, "
                 b"HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: " +
                 settings_value.encode() + b"\r\n\r\n")
    got = b""
    try:
        while len(got) < 200000:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
            if b"HTTP/1.1 200" in got and got.endswith(b"x" * 10):
                break
            if b"HTTP/1.1 101" in got and len(got) > 200:
                break
    except OSError:
        pass
    sock.close()
    assert got.startswith(b"HTTP/1.1 "), got[:100]
    status = int(got[9:12])
    if ok:
        assert status in (101, 200), got[:200]
    else:
        assert status in (400, 200) or status == 101, got[:200]
    shared.check_victim()


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
    gw = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{url: "http://127.0.0.1:{up.port}"}}
""", threads=1)
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


def test_an_upstream_reset_mid_upload_costs_the_clients_connection_no_window(build_dir,
                                                                             tmp_path):
    """The upstream resets an upload once 100 KB came; the client keeps sending its 3 MB
    (it learns late): its answer is a 502 or a reset, and its next upload on the same
    connection goes through whole."""
    def script(conn, sid):
        s = conn.stream(sid)
        if s.field(":path") == "/cut":
            conn.wait(lambda: len(s.body) >= 100_000 or s.done(), 10)
            conn.send(rst(sid, INTERNAL_ERROR))
        else:
            conn.wait(lambda: s.done(), 30)
            conn.answer(sid, 200, b"got %d" % len(s.body))

    from h2_raw import INTERNAL_ERROR
    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port, ", limits: {max_body: 64m}")
    try:
        c = Client(gw.port)
        c.send(c.head(1, "/cut", method="POST", end=False))
        c.upload(1, b"c" * 3_000_000, seconds=10)
        s = c.wait_done(1, 10)
        assert s.status() == 502 or s.reset is not None, (s.status(), s.reset)
        c.send(c.head(3, "/whole", method="POST", end=False))
        assert c.upload(3, b"w" * 3_000_000), "the second upload's windows stayed shut"
        s = c.wait_done(3, 20)
        assert (s.status(), s.body) == (200, b"got 3000000")
    finally:
        gw.stop()
        up.stop()
