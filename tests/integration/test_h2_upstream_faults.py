"""An HTTP/2 upstream that misbehaves costs only its own stream: a malformed answer is its
client's 502 and no one else's, a refused stream or a GOAWAY has the unprocessed requests sent
again, an oversized head or a request head larger than the upstream allows costs that stream
only, an upstream that never answers or stops mid-body costs its client its timeout, and one
that answers no PING stops no other client's requests."""
import struct
import time

import pytest

from h2_raw import (CONTINUATION, Client, END_HEADERS, END_STREAM, GOAWAY, HEADERS,
                    INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS, NO_ERROR, REFUSED_STREAM,
                    ScriptedUpstream, data, fetch, frame, rst, settings, window_update)
from h2_traffic import CountingRelay, Shared, gateway_to, misbehaving
from proxy_support import gateway


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


BAD_ANSWERS = {
    "connection-field": lambda conn, sid: conn.answer(sid, 200, b"x",
                                                      fields=[("connection", "close")]),
    "upper-case-name": lambda conn, sid: conn.answer(sid, 200, b"x", fields=[("X-Up", "1")]),
    "no-status": lambda conn, sid: conn.send(frame(
        HEADERS, END_HEADERS | END_STREAM, sid, conn.encode([("x-a", "1")]))),
    "status-twice": lambda conn, sid: conn.send(frame(
        HEADERS, END_HEADERS | END_STREAM, sid, conn.encode([(":status", "200"),
                                                             (":status", "204")]))),
    "length-short": lambda conn, sid: conn.answer(sid, 200, b"12345",
                                                  fields=[("content-length", "10")]),
    "length-long": lambda conn, sid: conn.answer(sid, 200, b"1234567890ab",
                                                 fields=[("content-length", "10")]),
    "data-before-head": lambda conn, sid: conn.send(data(sid, b"x", end=True)),
    "trailers-with-pseudo": lambda conn, sid: conn.send(
        frame(HEADERS, END_HEADERS, sid, conn.encode([(":status", "200")])), data(sid, b"x"),
        frame(HEADERS, END_HEADERS | END_STREAM, sid, conn.encode([(":status", "200")]))),
    "trailers-without-end": lambda conn, sid: conn.send(
        frame(HEADERS, END_HEADERS, sid, conn.encode([(":status", "200")])), data(sid, b"x"),
        frame(HEADERS, END_HEADERS, sid, conn.encode([("x-t", "1")]))),
    "101-on-h2": lambda conn, sid: conn.answer(sid, 101, fields=[("upgrade", "websocket")]),
    "status-600": lambda conn, sid: conn.answer(sid, 600, b"x"),
    "rst-internal": lambda conn, sid: conn.send(rst(sid, 2)),
    "data-past-window": lambda conn, sid: past_the_window(conn, sid),
}


def past_the_window(conn, sid):
    """The stream's window filled, a pause (the gateway's client reads nothing: no window comes
    back), then a frame more than the window has."""
    conn.send(frame(HEADERS, END_HEADERS, sid, conn.encode([(":status", "200")])))
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
