"""One HTTP/2 connection to an upstream carries many clients' requests through the gateway
(issue 68): one client's cancellations, resets or slow reading never cost another its answer
nor the connection; no client's value becomes another's HPACK reference, and what a client or
the upstream sent never indexed goes on so; `:path *` is an OPTIONS request's only."""
import random
import socket
import struct
import threading
import time

import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from h2_raw import (CANCEL, Client, GOAWAY, INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS,
                    PROTOCOL_ERROR, ScriptedUpstream, data, fetch, frame, rst)
from h2_traffic import (CountingRelay, PATIENT, failures, gateway_to, h2_cancel_all,
                        recording_upstream, run_clients)
from proxy_support import gateway, request, upstream


SIZES = [0, 1000, 16384, 65536, 100000, 300000]


def one_connection_gateway(build_dir, tmp_path, port, protocol="h2c"):
    """A gateway of one worker whose service a reaches 127.0.0.1:`port` over one HTTP/2
    connection at most (limits.max_connections)."""
    return gateway(build_dir, tmp_path, f"""
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: off
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{upstream: pool, protocol: {protocol}}}
upstreams:
  pool:
    targets: [{{address: "127.0.0.1:{port}"}}]
    limits: {{max_connections: 1}}
""", threads=1)


@pytest.mark.parametrize("seed", [68, 6801, 6802])
def test_many_clients_over_one_upstream_connection_cost_each_other_nothing(build_dir, tmp_path,
                                                                           seed):
    """40 HTTP/2 clients of 8 streams each and 40 HTTP/1.1 clients at once, through one h2c
    connection to the upstream: 4 in 10 requests given up (a reset right after the head, or
    one once the answer began; a closed HTTP/1.1 connection), 1 in 7 read slowly, and one
    HTTP/2 client in 5 reads everything through 8 KiB windows. Every request not given up
    gets its whole answer; the upstream connection is the one made first, never closed."""
    up = upstream(build_dir, "a", env=PATIENT)
    relay = CountingRelay(up.port)
    gw = one_connection_gateway(build_dir, tmp_path, relay.port)
    try:
        rng = random.Random(seed)
        for round_ in range(2):  # a second round on the same connection
            outcomes = run_clients(gw.port, rng, h2_clients=40, streams_each=8, h1_clients=40,
                                   path_of=lambda n: f"/bytes/{n}", sizes=SIZES)
            assert failures(outcomes) == [], f"round {round_}, seed {seed}"
            assert sum(r.kept() for r in outcomes) > 150
            assert sum(not r.kept() for r in outcomes) > 100
        assert relay.accepted == 1
        assert relay.closed == 0
    finally:
        gw.stop()
        relay.stop()
        up.stop()


@pytest.mark.parametrize("patient", [True, False])
def test_waves_of_a_hundred_answers_cancelled_in_flight_cost_no_other_request(build_dir, tmp_path,
                                                                             patient):
    """A client asks for 100 large answers on one connection, and once each has begun resets
    them all at once: the gateway resets 100 upstream streams whose DATA is on its way (each
    may have a window's worth in flight). Eight such waves, with a request read whole after
    each. To a patient upstream the connection is the first one throughout, never closed (a
    memory of 64 resets, or crossing DATA counted as the upstream's errors, would close it).
    An upstream that defends itself against so many resets (spindle's, by default) may close
    it: the requests of other clients still get their answers, on the next connection."""
    up = upstream(build_dir, "a", env=PATIENT if patient else {"KEEPALIVE_MS": "60000"})
    relay = CountingRelay(up.port)
    gw = one_connection_gateway(build_dir, tmp_path, relay.port)
    try:
        for wave in range(8):
            assert h2_cancel_all(gw.port, ["/bytes/1000000"] * 100) == 100, f"wave {wave}"
            status, _, body = request(gw, "GET", "/bytes/300000")
            assert (status, len(body)) == (200, 300000), f"wave {wave}"
        if patient:
            assert relay.accepted == 1
            assert relay.closed == 0
    finally:
        gw.stop()
        relay.stop()
        up.stop()


class RecordingUpstream:
    """An h2c upstream (Python's h2) that answers each request 200 with, as its body, the names
    of the fields that came never indexed, and a response field of its own sent never indexed;
    it keeps its decoder's table's entries."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.requests = []  # (path, {name: never_indexed})
        self.table = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(sock,), daemon=True).start()

    def _connection(self, sock):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8", validate_inbound_headers=False))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    fields = {}
                    for f in event.headers:
                        fields[f[0]] = fields.get(f[0], False) or not f.indexable
                    self.requests.append((dict(event.headers)[":path"], fields))
                    body = ",".join(sorted(n for n, never in fields.items() if never)).encode()
                    conn.send_headers(event.stream_id, [
                        (":status", "200"), ("content-length", str(len(body))),
                        hpack.NeverIndexedHeaderTuple("x-upstream-secret", "s3cret")])
                    conn.send_data(event.stream_id, body, end_stream=True)
            self.table = [(bytes(n).decode(), bytes(v).decode())
                          for n, v in conn.decoder.header_table.dynamic_entries]
            sock.sendall(conn.data_to_send())

    def stop(self):
        self.listener.close()


def h2_request(port, head):
    """One request of `head` (its fields, pseudo-fields first) on a new HTTP/2 connection:
    (status, body, {response field: sent never indexed}); "reset N" instead of a status for a
    stream reset with code N."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding="utf-8", validate_outbound_headers=False))
    conn.initiate_connection()
    conn.send_headers(1, head, end_stream=True)
    sock.sendall(conn.data_to_send())
    status, body, never = None, b"", {}
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            done = False
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[":status"])
                    never = {f[0]: not f.indexable for f in event.headers}
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    done = True
                elif isinstance(event, h2.events.StreamReset):
                    status, done = f"reset {event.error_code}", True
            sock.sendall(conn.data_to_send())
            if done:
                break
    finally:
        sock.close()
    return status, body.decode(), never


def test_what_was_sent_never_indexed_goes_on_so_and_no_clients_value_is_shared(build_dir,
                                                                               tmp_path):
    up = RecordingUpstream()
    gw = one_connection_gateway(build_dir, tmp_path, up.port)
    try:
        for who in ("alice", "bobby"):
            head = [(":method", "GET"), (":scheme", "http"), (":authority", "gateway.test"),
                    (":path", f"/account/{who}"),
                    ("accept-encoding", "gzip"),
                    ("cookie", f"session={who}"),
                    ("x-tenant", f"tenant-{who}")]
            if who == "alice":  # a field marked never indexed by the client, of a shared name
                head.append(hpack.NeverIndexedHeaderTuple("accept-language", "fr"))
            status, body, never = h2_request(gw.port, head)
            assert status == 200, (who, status)
            seen = set(body.split(","))
            # The upstream was told never to index the client's own values, the credential,
            # and (alice) every field of a request the client marked so.
            assert {":path", "cookie", "x-tenant"} <= seen, seen
            assert ("accept-language" in seen) == (who == "alice"), seen
            assert ("accept-encoding" in seen) == (who == "alice"), seen
            # The upstream's field sent never indexed came to the client so.
            assert never.get("x-upstream-secret") is True, never
        # The upstream's table (the connection both clients' requests shared) holds no value of
        # either client.
        values = " ".join(v for _, v in up.table)
        for secret in ("alice", "bobby"):
            assert secret not in values, up.table
        assert len(up.requests) == 2
    finally:
        gw.stop()
        up.stop()


def test_an_asterisk_path_with_another_method_than_options_is_not_forwarded(build_dir, tmp_path):
    up = RecordingUpstream()
    gw = one_connection_gateway(build_dir, tmp_path, up.port)
    try:
        for method in ("GET", "POST", "DELETE"):
            status, _, _ = h2_request(gw.port, [(":method", method), (":scheme", "http"),
                                                (":authority", "gateway.test"), (":path", "*")])
            assert status == "reset 1", (method, status)  # PROTOCOL_ERROR
        assert up.requests == []
        status, _, _ = h2_request(gw.port, [(":method", "GET"), (":scheme", "http"),
                                            (":authority", "gateway.test"), (":path", "/ok")])
        assert status == 200
        assert [path for path, _ in up.requests] == ["/ok"]
    finally:
        gw.stop()
        up.stop()


# ---- a body cut short must not reach the upstream as a whole one -------------------------------


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
