"""Traffic for the tests of a gateway's shared HTTP/2 upstream connections (issue 68): a relay
that counts the connections made through it and notes each one that closed, and clients
(HTTP/2 and HTTP/1.1) that read whole, read slowly, or give up (reset, close) at random. Every
client that did not give up must get its whole answer. Also the stage of the HTTP/2 tests:
`gateway_to` (one worker, one h2c connection to the upstream), `Shared` (a victim download in
flight on that connection while a test attacks; the `shared` fixture of conftest.py), scripted
h2 upstreams that record or misbehave."""
import random
import selectors
import socket
import threading
import time
import traceback

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from h2_raw import Client, ScriptedUpstream, fetch, window_update
from proxy_support import free_port, gateway, upstream


class CountingRelay:
    """Listens on a free loopback port and pipes each connection to `target_port`; counts the
    connections it took and those that ended (by either side)."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.closed = 0
        self.lock = threading.Lock()
        self.stopping = False
        self.threads = []
        self.sockets = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self):
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.accepted += 1
                self.sockets += [client, upstream]
            t = threading.Thread(target=self._pipe, args=(client, upstream), daemon=True)
            t.start()
            self.threads.append(t)

    def _pipe(self, a, b):
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select(timeout=1):
                    try:
                        data = key.fileobj.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        return
                    key.data.sendall(data)
                if self.stopping:
                    return
        except OSError:
            return
        finally:
            with self.lock:
                if not self.stopping:
                    self.closed += 1
            sel.close()
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def stop(self):
        self.stopping = True
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for t in self.threads:
            t.join(timeout=5)


class Outcome:
    """What one request got: its status, its body's size, whether it ended whole, and what the
    client did (whole, slow, cancel_early, cancel_mid)."""

    def __init__(self, path, size, action):
        self.path, self.size, self.action = path, size, action
        self.status = None
        self.got = 0
        self.ended = False
        self.error = None

    def kept(self):
        return self.action in ("whole", "slow")

    def ok(self):
        return self.status == 200 and self.got == self.size and self.ended


def h2_client(port, requests, slow=False, seconds=60):
    """One HTTP/2 connection to the gateway, every request of `requests` (Outcomes) on a stream
    of it at once. cancel_early resets a stream right after its head; cancel_mid once some of
    its answer came; `slow` reads through small windows given back a little late."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=seconds)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding="utf-8"))
    if slow:
        conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 8192})
    conn.initiate_connection()
    by_stream = {}
    for r in requests:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "GET"), (":scheme", "http"),
                                (":authority", "gateway.test"), (":path", r.path)],
                          end_stream=True)
        by_stream[sid] = r
    for sid, r in list(by_stream.items()):
        if r.action == "cancel_early":
            conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            r.ended = True
    sock.sendall(conn.data_to_send())
    deadline = time.monotonic() + seconds
    try:
        while not all(r.ended or r.error for r in by_stream.values()):
            if time.monotonic() > deadline:
                raise TimeoutError("answers did not all come")
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the gateway closed the connection")
            for event in conn.receive_data(data):
                r = by_stream.get(getattr(event, "stream_id", 0))
                if isinstance(event, h2.events.ResponseReceived) and r is not None:
                    r.status = int(dict(event.headers)[":status"])
                elif isinstance(event, h2.events.DataReceived) and r is not None:
                    r.got += len(event.data)
                    if slow:
                        time.sleep(0.001)
                    if r.action == "cancel_mid" and not r.ended and event.stream_ended is None:
                        r.ended = True
                        try:
                            conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.CANCEL)
                        except h2.exceptions.StreamClosedError:
                            pass  # the gateway ended it first (in the same read)
                    # (The connection's window, whatever became of the stream.)
                    conn.acknowledge_received_data(event.flow_controlled_length,
                                                   event.stream_id)
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and r is not None:
                    r.ended = True
                elif isinstance(event, h2.events.StreamReset) and r is not None:
                    if not r.ended:
                        r.error = f"reset by the gateway ({event.error_code})"
            sock.sendall(conn.data_to_send())
    except (OSError, h2.exceptions.ProtocolError) as e:
        for r in by_stream.values():
            if not r.ended and r.error is None:
                r.error = f"{e!r} at {traceback.format_exc(limit=-2)}"
    finally:
        sock.close()


def h1_client(port, r, seconds=60):
    """One HTTP/1.1 request of Outcome `r`: read whole, slowly, or given up after a piece
    (cancel_mid) or at once (cancel_early)."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=seconds)
        sock.sendall(f"GET {r.path} HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n\r\n"
                     .encode())
        if r.action == "cancel_early":
            sock.close()
            return
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the head")
            buffer += chunk
        head, _, body = buffer.partition(b"\r\n\r\n")
        r.status = int(head.split(b" ")[1])
        r.got = len(body)
        while True:
            if r.action == "cancel_mid":
                sock.close()
                return
            chunk = sock.recv(4096 if r.action == "slow" else 65536)
            if not chunk:
                break
            r.got += len(chunk)
            if r.action == "slow":
                time.sleep(0.002)
        r.ended = True
        sock.close()
    except OSError as e:
        r.error = repr(e)


def random_plan(rng, n, path_of, sizes, cancel_share=0.4, slow_share=0.15):
    """`n` Outcomes of random sizes and actions."""
    plan = []
    for _ in range(n):
        size = rng.choice(sizes)
        roll = rng.random()
        action = ("cancel_early" if roll < cancel_share / 2 else
                  "cancel_mid" if roll < cancel_share else
                  "slow" if roll < cancel_share + slow_share else "whole")
        plan.append(Outcome(path_of(size), size, action))
    return plan


def run_clients(port, rng, h2_clients, streams_each, h1_clients, path_of, sizes):
    """Runs the clients at once (threads); returns every Outcome."""
    outcomes, threads = [], []
    for i in range(h2_clients):
        plan = random_plan(rng, streams_each, path_of, sizes)
        outcomes += plan
        slow = i % 5 == 0
        threads.append(threading.Thread(target=h2_client, args=(port, plan, slow)))
    for _ in range(h1_clients):
        (r,) = random_plan(rng, 1, path_of, sizes)
        outcomes.append(r)
        threads.append(threading.Thread(target=h1_client, args=(port, r)))
    rng.shuffle(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return outcomes


def failures(outcomes):
    """The requests kept (not given up) that did not get their whole answer, described."""
    return [f"{r.action} {r.path}: status {r.status}, {r.got}/{r.size} bytes, "
            f"ended {r.ended}, {r.error}" for r in outcomes if r.kept() and not r.ok()]


def wait_listening(proc, port, seconds=10):
    """Waits until something accepts on `port` (`proc` must not exit meanwhile)."""
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, f"the peer exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)


def h2_cancel_all(port, paths, seconds=30):
    """One HTTP/2 connection asks for every path of `paths` at once, waits until each answer
    has begun (its head and some data), then resets them all in one write: the answers on
    their way to the gateway cross its resets upstream. The streams' count of answers begun."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=seconds)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding="utf-8"))
    conn.initiate_connection()
    begun = {}
    for path in paths:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "GET"), (":scheme", "http"),
                                (":authority", "gateway.test"), (":path", path)],
                          end_stream=True)
        begun[sid] = False
    sock.sendall(conn.data_to_send())
    deadline = time.monotonic() + seconds
    try:
        while not all(begun.values()) and time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    begun[event.stream_id] = True
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            sock.sendall(conn.data_to_send())
        for sid in begun:
            try:
                conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            except h2.exceptions.StreamClosedError:
                pass
        sock.sendall(conn.data_to_send())
        return sum(begun.values())
    finally:
        sock.close()


# An upstream that lets a gateway reset as many streams as its clients cancel (spindle's own
# server allows 200 beyond the streams completed, 100 of running ones at once then 5 a second:
# docs/configuration.md), and keeps an idle connection a minute.
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


def goaway_code(c, seconds=10):
    c.wait(lambda: c.goaway is not None, seconds)
    return None if c.goaway is None else c.goaway[1]


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
