"""HTTP/2 streams as RFC 9113 says they end (§5.1, §8.1.1, §8.2): DATA after END_STREAM,
connection errors that end that connection only, PRIORITY on idle streams, streams past
MAX_CONCURRENT_STREAMS, malformed requests and request trailers reset and never forwarded, a head
in many CONTINUATIONs read as one, the body and header timeouts ending what stops coming, a
preface sent a byte at a time, and h2c upgrades with any HTTP2-Settings. Each checks that the
other clients of the shared upstream connection (h2_traffic.Shared) lose nothing."""
import time

import pytest

from h2_raw import (COMPRESSION_ERROR, CONTINUATION, Client, END_HEADERS, END_STREAM,
                    FLOW_CONTROL_ERROR, HEADERS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, NO_ERROR,
                    PROTOCOL_ERROR, REFUSED_STREAM, STREAM_CLOSED, ScriptedUpstream, data, frame,
                    priority, rst, settings, window_update)
from h2_traffic import Shared, gateway_to, goaway_code, recording_upstream


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
