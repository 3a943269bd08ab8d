"""One HTTP/2 connection to an upstream carries many clients' requests through the gateway
(issue 68): one client's cancellations, resets or slow reading never cost another its answer
nor the connection; no client's value becomes another's HPACK reference, and what a client or
the upstream sent never indexed goes on so; `:path *` is an OPTIONS request's only."""
import random
import socket
import threading

import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from h2_traffic import CountingRelay, failures, h2_cancel_all, run_clients
from proxy_support import gateway, request, upstream

SIZES = [0, 1000, 16384, 65536, 100000, 300000]

# An upstream that lets a gateway reset as many streams as its clients cancel (spindle's own
# server allows 200 beyond the streams completed, 100 of running ones at once then 5 a second:
# docs/configuration.md), and keeps an idle connection a minute.
PATIENT = {"H2_RESET_LIMITS": "100000", "KEEPALIVE_MS": "60000"}


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
