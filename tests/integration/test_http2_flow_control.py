"""HTTP/2 flow control through the gateway (RFC 9113 §5.2, §6.9), both sides of it: a window
past 2^31-1 is that connection's or that stream's error only, a zero or negative window opened
again by SETTINGS delivers the answer whole, and no upload reset, refused, answered early
(413, or an upstream's answer then RST_STREAM(NO_ERROR)), padded or cut by an upstream's reset
ever loses the connection any window. Raw clients (h2_raw.py) against a gateway of one worker
whose service reaches its upstream over one shared h2c connection (h2_traffic.Shared)."""
import struct
import time

from h2_raw import (Client, END_HEADERS, FLOW_CONTROL_ERROR, HEADERS, INITIAL_WINDOW_SIZE,
                    MAX_CONCURRENT_STREAMS, NO_ERROR, ScriptedUpstream, data, fetch, frame, rst,
                    settings, window_update)
from h2_traffic import CountingRelay, gateway_to, goaway_code, recording_upstream


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
