"""The gateway's peers under network faults, one case per part and toxic: Toxiproxy
(tests/integration/toxiproxy.py) sits between spindle and (a) an HTTP/1.1 upstream, (b) an h2c
upstream, (c) forward_auth's service, (d) a mirror target, (e) Redis (shared rate limits), and
injects latency, a bandwidth limit, a stall (timeout toxic), a reset in the middle of an
exchange, an answer cut short (limit_data) and a half-open path (what spindle sends is
swallowed: the peer never hears of it and nothing ever comes back, no FIN, no RST).

Each case states what the client sees (its answer, or a named error within the configured
timeout), that the one worker never stalls (a probe's /ping, answered by the gateway itself,
within 100 ms all through), and that nothing is lost or sent twice (the POSTs the upstream
counted). After the fault is removed, the same request is answered again. PostgreSQL's cases
are tests/integration/test_faults_postgres.py; docs/operations.md ("When things fail") says
the same per part and fault."""
import http.client
import threading
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from conftest import sanitizer_build
from proxy_support import (RecordingUpstream, gateway, h2_connect, h2_events_until,
                           request_headers, wait_until)
from test_rate_limit_redis import Redis
from toxiproxy import Toxiproxy, Unavailable

BIG = 60_000  # an answer long enough to be cut in its middle, within HTTP/2's first window
# Short limits, so that every stall ends within the case's time.
TIMEOUTS = "timeouts: {connect: 500ms, first_byte: 1s, read: 1s, write: 1s}"
FIRST_BYTE = 1.0
REDIS_TIMEOUT = 0.1
PROBE_BOUND = 0.1  # a /ping slower than this means the worker was held


@pytest.fixture(scope="module")
def toxi():
    try:
        server = Toxiproxy()
    except Unavailable as why:
        pytest.skip(str(why))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    r = Redis(tmp_path_factory.mktemp("redis"))
    yield r
    r.stop()


PAUSE = 0.3  # how long the peer pauses in the middle of a long answer, when asked to


class Counting(RecordingUpstream):
    """An HTTP/1.1 upstream that counts what it receives and answers POST /big with BIG bytes
    (in two halves PAUSE seconds apart for /big?pause)."""

    def __init__(self):
        super().__init__(pause=PAUSE)

    def answer(self, head, body):
        target = head.split(b" ", 2)[1]
        size = BIG if target.startswith(b"/big") else 2
        whole = (b"HTTP/1.1 200 OK\r\nX-Auth-User: alice\r\nContent-Length: %d\r\n\r\n" %
                 size + b"b" * size)
        return [whole[:-size // 2], whole[-size // 2:]] if b"pause" in target else whole

    def posts(self):
        return sum(t.startswith("POST ") for t in self.targets())


class CountingH2c(RecordingUpstream):
    """An h2c upstream (Python's h2, prior knowledge) that counts the requests it receives and
    answers /big with BIG bytes."""

    def handle(self, sock):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        try:
            sock.sendall(conn.data_to_send())
            while data := sock.recv(65536):
                for event in conn.receive_data(data):
                    self.on(sock, conn, event)
                sock.sendall(conn.data_to_send())
        except Exception:  # noqa: BLE001  (a connection cut on purpose)
            pass
        finally:
            sock.close()

    def on(self, sock, conn, event):
        if isinstance(event, h2.events.DataReceived):
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        if not isinstance(event, h2.events.RequestReceived):
            return
        fields = dict((bytes(n), bytes(v)) for n, v in event.headers)
        with self.lock:
            self.requests.append((fields[b":method"] + b" " + fields[b":path"], b""))
        size = BIG if fields[b":path"].startswith(b"/big") else 2
        conn.send_headers(event.stream_id, [(":status", "200"), ("content-length", str(size))])
        for at in range(0, size, 16384):
            if b"pause" in fields[b":path"] and at >= size // 2 > at - 16384:
                sock.sendall(conn.data_to_send())
                time.sleep(PAUSE)
            conn.send_data(event.stream_id, b"b" * min(16384, size - at),
                           end_stream=at + 16384 >= size)

    def posts(self):
        return sum(t.startswith("POST ") for t in self.targets())


PING = """
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: off
routes:
  - name: ping
    match: {path: /ping}
    middlewares: [{respond: {body: pong}}]
    service: a
"""


def part_config(part, proxied, primary):
    """The gateway of `part`: the faulty path (a Toxiproxy proxy) is at `proxied[0]`; the
    upstream that counts the client's POSTs at `primary`. For http1 and h2c, the upstream is the
    faulty path, two targets (`proxied`, two proxies to it): a request sent again after a fault
    would have somewhere to go."""
    middleware, services, top = "[]", f'  a: {{url: "http://{primary}", {TIMEOUTS}}}\n', ""
    targets, proxied = proxied, proxied[0]
    if part in LONG_ANSWERS:
        protocol = ", protocol: h2c" if part == "h2c" else ""
        targets = ", ".join(f'{{address: "{p}"}}' for p in targets)
        services = f"  a: {{upstream: u{protocol}, {TIMEOUTS}}}\n"
        top = f"upstreams:\n  u: {{targets: [{targets}]}}\n"
    elif part == "forward_auth":
        middleware = "[{forward_auth: {service: auth, path: /verify}}]"
        services += f'  auth: {{url: "http://{proxied}", {TIMEOUTS}}}\n'
    elif part == "mirror":
        middleware = "[{mirror: {service: shadow, timeout: 1s}}]"
        services += f'  shadow: {{url: "http://{proxied}", {TIMEOUTS}}}\n'
    elif part == "redis":
        top = f"redis: {{address: {proxied}, timeout: 100ms, backoff: 200ms}}\n"
        middleware = ("[{rate_limit: {key: route, rate: 1000/s, burst: 1000, store: redis, "
                      "batch: 1, failure_mode: closed}}]")
    return PING + f"""  - name: part
    match: {{path_prefix: /}}
    middlewares: {middleware}
    service: a
services:
{services}{top}"""


class Probe:
    """A second client asking `path` (answered by the server itself: `body`) on its own
    keep-alive connection every 10 ms while the case runs: the slowest answer is the longest the
    worker was held."""

    def __init__(self, gw, path="/ping", body=b"pong"):
        self.gw, self.path, self.body = gw, path, body
        self.slowest, self.failures, self.count = 0.0, [], 0
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        conn = http.client.HTTPConnection(self.gw.host, self.gw.port, timeout=5)
        while self.running:
            started = time.monotonic()
            try:
                conn.request("GET", self.path)
                answer = conn.getresponse()
                body = answer.read()
                if (answer.status, body) != (200, self.body):
                    self.failures.append((answer.status, body))
            except (OSError, http.client.HTTPException) as e:
                self.failures.append(repr(e))
                conn.close()
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.count += 1
            time.sleep(0.01)
        conn.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.thread.join(timeout=10)


def post(gw, path="/big", timeout=10):
    """POST `path` with a 100-byte body on a new connection: (status or "cut" for an answer
    whose body ended early, the body, seconds taken)."""
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=timeout)
    started = time.monotonic()
    try:
        conn.request("POST", path, body=b"p" * 100)
        answer = conn.getresponse()
        try:
            body = answer.read()
            status = answer.status
        except http.client.IncompleteRead as e:
            body, status = e.partial, "cut"
    except (http.client.RemoteDisconnected, ConnectionResetError):
        body, status = b"", "cut"
    finally:
        conn.close()
    return status, body, time.monotonic() - started


# The toxics, by name: [(type, stream, attributes)]. reset_peer passes no byte: it resets the
# connection once bytes come its way. So "reset" in the middle of a long answer is added while
# the peer pauses in the middle of its body (the client asks "?pause" then, and the toxic comes
# MIDWAY seconds after the request, before the body's second half); for a short answer, the
# connection is reset as the request goes. "reset_answer": the request reaches the peer, its
# answer is replaced by a reset.
MIDWAY = 0.15
TOXICS = {
    "latency": [("latency", "downstream", {"latency": 300})],
    "bandwidth": [("bandwidth", "downstream", {"rate": 100})],  # KB/s: BIG in ~0.6 s
    "stall": [("timeout", "downstream", {"timeout": 0})],
    "reset": [],  # reset_peer, MIDWAY in
    "reset_short": [("reset_peer", "upstream", {"timeout": 0})],
    "reset_answer": [("reset_peer", "downstream", {"timeout": 0})],
    "cut": [("limit_data", "downstream", {"bytes": BIG // 2})],
    "cut_short": [("limit_data", "downstream", {"bytes": 3})],
    "half_open": [("timeout", "upstream", {"timeout": 0})],
}
LONG_ANSWERS = ("http1", "h2c")  # the parts whose peer's answer is BIG

# What the client sees, by part and toxic: (status, the fewest and most seconds it takes, the
# POSTs the counting upstream receives, the requests forward_auth's service or the mirror target
# receives). "cut": the head came, the body ended early.
NO_ANSWER = (FIRST_BYTE - 0.05, FIRST_BYTE + 0.5)  # the first-byte timeout's end
A_BODY_CUT = ("cut", 0.0, FIRST_BYTE + PAUSE, 1, None)
STORE_DOWN = (503, 0.0, REDIS_TIMEOUT + 0.4, 0, None)
EXPECTED = {
    **{(part, toxic): expected for part in LONG_ANSWERS for toxic, expected in {
        "latency": (200, 0.3, 1.0, 1, None),
        "bandwidth": (200, 0.4, 2.0, 1, None),
        "stall": (504, *NO_ANSWER, 1, None),
        "reset": A_BODY_CUT,
        # The POST reached the upstream: never sent again, whatever its connection did.
        "reset_answer": (502, 0.0, 0.5, 1, None),
        "cut": A_BODY_CUT,
        "half_open": (504, *NO_ANSWER, 0, None),
    }.items()},
    # forward_auth: the service's answer lets the POST through; no answer refuses it (503), and
    # nothing goes through unchecked. Its GET is sent again once on a new connection when a
    # pooled one closed before any answer byte (the keep-alive race).
    ("forward_auth", "latency"): (200, 0.3, 1.0, 1, 1),
    ("forward_auth", "bandwidth"): (200, 0.0, 1.0, 1, 1),
    ("forward_auth", "stall"): (503, *NO_ANSWER, 0, 1),
    ("forward_auth", "reset"): (503, 0.0, 0.5, 0, 0),
    ("forward_auth", "reset_answer"): (503, 0.0, 0.5, 0, 2),
    ("forward_auth", "cut"): (503, 0.0, 0.5, 0, 1),
    ("forward_auth", "half_open"): (503, *NO_ANSWER, 0, 0),
    # mirror: whatever its target does, the client's answer is the primary's, at once; a copy is
    # never sent twice.
    **{("mirror", toxic): (200, 0.0, 0.5, 1, copies) for toxic, copies in {
        "latency": 1, "bandwidth": 1, "stall": 1, "reset": 0, "reset_answer": 1, "cut": 1,
        "half_open": 0}.items()},
    # redis (failure_mode: closed): no reply within redis.timeout is no store: 503 then.
    ("redis", "latency"): (503, REDIS_TIMEOUT, REDIS_TIMEOUT + 0.4, 0, None),
    ("redis", "bandwidth"): (200, 0.0, 0.5, 1, None),
    ("redis", "stall"): (503, REDIS_TIMEOUT, REDIS_TIMEOUT + 0.4, 0, None),
    ("redis", "reset"): STORE_DOWN,
    ("redis", "reset_answer"): STORE_DOWN,
    ("redis", "cut"): STORE_DOWN,
    ("redis", "half_open"): (503, REDIS_TIMEOUT, REDIS_TIMEOUT + 0.4, 0, None),
}
# What an answer of the gateway's own says, by status (and part).
SAYS = {504: b"504 Gateway Timeout: no response within the first-byte timeout",
        502: b"502 Bad Gateway: connection closed before any response byte",
        ("forward_auth", 503): b"503 Service Unavailable: authentication service unavailable",
        ("redis", 503): b"503 Service Unavailable: rate limit store unavailable"}


def toxics_of(part, toxic):
    if toxic in ("reset", "cut") and part not in LONG_ANSWERS:
        return TOXICS[toxic + "_short"]
    return TOXICS[toxic]


@pytest.mark.parametrize("part,toxic", [pytest.param(*case, id="-".join(case))
                                        for case in EXPECTED])
def test_a_fault_on_the_path_to_a_part(build_dir, tmp_path, toxi, redis, part, toxic):
    upstream = CountingH2c() if part == "h2c" else Counting()
    peer = {"http1": upstream, "h2c": upstream, "forward_auth": Counting(),
            "mirror": Counting(), "redis": redis}[part]
    proxies = [toxi.proxy(f"{part}-{toxic}-{i}-{time.monotonic_ns()}", f"127.0.0.1:{peer.port}")
               for i in range(2 if part in LONG_ANSWERS else 1)]
    gw = gateway(build_dir, tmp_path, part_config(part, [p.address for p in proxies],
                                                  f"127.0.0.1:{upstream.port}"), threads=1)
    try:
        # The path works, and a pooled connection to the peer exists.
        assert post(gw)[0] == 200
        if part == "mirror":  # its copy, which goes on its own
            assert wait_until(lambda: peer.targets())
        before = upstream.posts()
        for kind, stream, attributes in toxics_of(part, toxic):
            for proxy in proxies:
                proxy.add(kind, stream=stream, **attributes)
        status, low, high, posts, peer_requests = EXPECTED[part, toxic]
        peer_before = len(peer.targets()) if peer_requests is not None else 0
        # Slack for a sanitizer build's slower steps in the answer's time (never for /ping).
        slack = 0.5 if sanitizer_build(build_dir) else 0.0
        midway = toxic == "reset" and part in LONG_ANSWERS
        late = threading.Timer(MIDWAY, lambda: [p.add("reset_peer", timeout=0) for p in proxies])
        with Probe(gw) as probe:
            if midway:
                late.start()
            got, body, seconds = post(gw, "/big?pause" if midway else "/big")
            # What the peer still does after the answer (a mirror copy on its way) happens
            # under the probe too.
            time.sleep(0.3)
        assert got == status, (got, body[:200], list(gw.errors))
        assert low <= seconds <= high + slack, f"answered {got} in {seconds:.2f} s"
        if got == 200:
            assert body == b"b" * BIG
        elif got != "cut":
            assert body.startswith(SAYS.get(got) or SAYS[part, got]), body
        # Nothing lost, nothing sent twice (a POST is never sent again after it went).
        assert upstream.posts() - before == posts, upstream.targets()
        if peer_requests is not None:
            assert len(peer.targets()) - peer_before == peer_requests, peer.targets()
        assert not probe.failures, probe.failures
        assert probe.count >= 5
        assert probe.slowest < PROBE_BOUND, f"/ping took {probe.slowest * 1000:.0f} ms"
        # Healed: the fault gone, the same request is answered (after a back-off at most).
        toxi.reset()
        give_up = time.monotonic() + 3
        while (answer := post(gw))[0] != 200:
            assert time.monotonic() < give_up, (answer[:2], list(gw.errors))
            time.sleep(0.05)
    finally:
        for proxy in proxies:
            proxy.delete()
        assert gw.stop() == 0, "".join(gw.errors)
        upstream.stop()
        if peer not in (upstream, redis):
            peer.stop()


@pytest.mark.parametrize("part", LONG_ANSWERS)
@pytest.mark.parametrize("toxic", ["reset", "cut"])
def test_an_answer_cut_upstream_reaches_an_http2_client_as_a_reset_stream(
        build_dir, tmp_path, toxi, part, toxic):
    """An HTTP/2 client of an answer the upstream's path cut (reset or closed in its body): the
    head and the bytes that came, then RST_STREAM, never END_STREAM (which would make the
    bytes that came look whole); the connection serves its next stream."""
    upstream = CountingH2c() if part == "h2c" else Counting()
    proxy = toxi.proxy(f"h2-{part}-{toxic}-{time.monotonic_ns()}", f"127.0.0.1:{upstream.port}")
    gw = gateway(build_dir, tmp_path, part_config(part, [proxy.address], ""), threads=1)
    s, conn = h2_connect(gw)
    try:
        if toxic == "cut":
            proxy.add("limit_data", bytes=BIG // 2)
        else:
            threading.Timer(MIDWAY, proxy.add, ["reset_peer"], {"timeout": 0}).start()
        conn.send_headers(1, request_headers("/big?pause", method="POST"), end_stream=True)
        s.sendall(conn.data_to_send())
        events = h2_events_until(s, conn, lambda ev: any(
            isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev), seconds=5)
        kinds = [type(e) for e in events]
        got = sum(len(e.data) for e in events if isinstance(e, h2.events.DataReceived))
        assert h2.events.ResponseReceived in kinds
        assert h2.events.StreamReset in kinds and h2.events.StreamEnded not in kinds, kinds
        assert got < BIG
        reset = next(e for e in events if isinstance(e, h2.events.StreamReset))
        assert reset.error_code == h2.errors.ErrorCodes.INTERNAL_ERROR
        assert upstream.posts() == 1
        # The client's connection still serves (the stream was reset, not the connection).
        conn.send_headers(3, request_headers("/ping"), end_stream=True)
        s.sendall(conn.data_to_send())
        events = h2_events_until(s, conn, lambda ev: any(
            isinstance(e, h2.events.StreamEnded) for e in ev), seconds=5)
        assert b"pong" in b"".join(e.data for e in events
                                   if isinstance(e, h2.events.DataReceived))
    finally:
        s.close()
        proxy.delete()
        assert gw.stop() == 0, "".join(gw.errors)
        upstream.stop()
