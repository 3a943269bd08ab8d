"""TLS under faults, on the serving side: every connection counts from its accept (a stalled
handshake holds its place in max_connections_per_worker), every read has a deadline (a TLS
record cut short is held no longer than the keep-alive or header timeout, HTTP/2 as HTTP/1.1),
and `http2: only` never answers in HTTP/1.1 whatever ALPN offers. A handshake has a deadline as
a whole (a ClientHello trickled a byte at a time, a client that stops after the server's
flight), and renegotiation asked by a TLS 1.2 client is refused at no cost."""
import os
import socket
import ssl
import subprocess
import time

import h2.config
import h2.connection
import h2.events
import pytest

from conftest import Server
from proxy_support import spindle_bin


def serve(build_dir, tmp_path, certs, extra="", http2="true", threads=1):
    config = tmp_path / "tls.yaml"
    config.write_text(f"""
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: off
    http2: {http2}
    timeouts: {{handshake: 10s, keepalive: 1s, header: 1s}}
    tls: {{cert: {certs}/localhost.pem, key: {certs}/localhost.key}}
{extra}
""")
    return Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(config),
                   "--threads", str(threads)])


def closed_within(sock, seconds):
    """True if the peer closes `sock` (EOF or reset) within `seconds`, whatever it sends first."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not sock.recv(65536):
                return True
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


class RawTls:
    """A TLS client over a plain socket whose records the test sends as it likes (a record cut
    short, say): the handshake through memory BIOs, then record(plaintext) gives the bytes of
    one TLS record, which the test writes to `sock` itself."""

    def __init__(self, server, alpn):
        self.sock = socket.create_connection((server.host, server.port), timeout=5)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if alpn:
            ctx.set_alpn_protocols(alpn)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self.outgoing.read())
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("closed during the handshake")
                self.incoming.write(data)
        self.sock.sendall(self.outgoing.read())

    def record(self, plaintext):
        self.tls.write(plaintext)
        return self.outgoing.read()

    def read_until(self, marker, seconds=5):
        """Decrypts what comes until the plaintext holds `marker`; returns the plaintext."""
        self.sock.settimeout(seconds)
        plain = b""
        while marker not in plain:
            more = self.sock.recv(65536)
            if not more:
                raise ConnectionError(f"closed before {marker!r}: {plain!r}")
            self.incoming.write(more)
            try:
                while piece := self.tls.read(65536):
                    plain += piece
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                raise ConnectionError(f"closed (close_notify) before {marker!r}: {plain!r}")
        return plain

    def close(self):
        self.sock.close()


def h2_preface_and_get(path="/plaintext"):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"),
                          (":path", path)], end_stream=True)
    return conn, conn.data_to_send()


# Where a record is cut: its first byte, its whole header (5 bytes), half of it, all but its
# last byte.
CUTS = [lambda n: 1, lambda n: 5, lambda n: n // 2, lambda n: n - 1]


@pytest.mark.parametrize("protocol", ["h2", "http/1.1"])
def test_a_record_cut_short_is_held_no_longer_than_the_timeouts(build_dir, tmp_path, certs,
                                                                  protocol):
    server = serve(build_dir, tmp_path, certs)
    try:
        held = []
        for cut in CUTS:
            # The first record cut short (before any request), and one after a request was
            # answered (the connection idle, with part of a record in OpenSSL's buffer).
            for after_request in (False, True):
                c = RawTls(server, [protocol])
                http1 = b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"
                if after_request:
                    conn, first = h2_preface_and_get()
                    c.sock.sendall(c.record(first if protocol == "h2" else http1))
                    c.read_until(b"Hello, World!")
                    if protocol == "h2":
                        conn.ping(b"12345678")
                        request = conn.data_to_send()  # a PING frame
                    else:
                        request = http1
                else:
                    request = h2_preface_and_get()[1] if protocol == "h2" else http1
                record = c.record(request)
                c.sock.sendall(record[:cut(len(record))])
                held.append(c)
        # keep-alive and header timeouts are 1 s: each is closed within a few seconds (before
        # the fix, HTTP/2's were held for good).
        start = time.monotonic()
        still_open = [i for i, c in enumerate(held) if not closed_within(c.sock, 6 - (time.monotonic() - start))]
        assert still_open == [], f"{len(still_open)} of {len(held)} connections held: {still_open}"
        # And the server serves on.
        c = RawTls(server, ["http/1.1"])
        c.sock.sendall(c.record(b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"))
        c.read_until(b"Hello, World!")
        c.close()
        for c in held:
            c.close()
    finally:
        assert server.stop() == 0


def test_stalled_handshakes_count_against_the_connection_limit(build_dir, tmp_path, certs):
    # One worker, 8 places. 30 clients that stall in their handshake: 8 hold a place each (as
    # in nginx's worker_connections and haproxy's maxconn), the others are closed at once
    # rather than each holding a socket and OpenSSL's state for the handshake timeout (10 s).
    server = serve(build_dir, tmp_path, certs, extra="    limits: {max_connections_per_worker: 8}")
    stalled = []
    try:
        for _ in range(30):
            s = socket.create_connection((server.host, server.port), timeout=5)
            s.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a 512-byte ClientHello
            stalled.append(s)
            time.sleep(0.01)  # accepted in this order
        closed = sum(closed_within(s, 0.1) for s in stalled)
        assert closed >= 22, f"only {closed} of 30 stalled handshakes closed at once"
        # With every place held, a complete client is turned away too (closed, not served)...
        ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
        with socket.create_connection((server.host, server.port), timeout=5) as raw:
            try:
                ctx.wrap_socket(raw, server_hostname="localhost").close()
                served = True
            except (ssl.SSLError, OSError):
                served = False
            assert not served, "a ninth connection was taken with eight places held"
        # ...and once they let go, served.
        for s in stalled:
            s.close()
        stalled = []
        deadline = time.monotonic() + 5
        while True:
            try:
                with socket.create_connection((server.host, server.port), timeout=5) as raw:
                    with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                        s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n")
                        assert b"Hello, World!" in s.recv(65536) + s.recv(65536)
                break
            except (ssl.SSLError, ConnectionError, OSError, AssertionError):
                assert time.monotonic() < deadline, "not served once the stalled ones left"
                time.sleep(0.1)
    finally:
        for s in stalled:
            s.close()
        assert server.stop() == 0


def test_http2_only_never_answers_http1_to_a_client_without_alpn(build_dir, tmp_path, certs):
    server = serve(build_dir, tmp_path, certs, http2="only")
    try:
        # No ALPN, HTTP/1.1: not answered in HTTP/1.1 (closed; HTTP/2 at most says GOAWAY).
        c = RawTls(server, None)
        c.sock.sendall(c.record(b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"))
        try:
            plain = c.read_until(b"\r\n\r\n")
        except (ConnectionError, OSError, ssl.SSLError) as e:
            plain = str(e).encode()
        assert b"HTTP/1.1" not in plain and b"Hello" not in plain, plain
        c.close()
        # No ALPN, HTTP/2 (prior knowledge over TLS, as a gRPC client may): served.
        c = RawTls(server, None)
        conn, first = h2_preface_and_get()
        c.sock.sendall(c.record(first))
        c.sock.settimeout(5)
        status = None
        while status is None:
            more = c.sock.recv(65536)
            assert more, "closed before answering"
            c.incoming.write(more)
            try:
                data = c.tls.read(65536)
            except ssl.SSLWantReadError:
                continue
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[b":status"]
        assert status == b"200"
        c.close()
        # ALPN offering only http/1.1: refused in the handshake, as before.
        with pytest.raises((ssl.SSLError, ConnectionError)):
            RawTls(server, ["http/1.1"])
    finally:
        assert server.stop() == 0


def test_a_record_cut_short_while_a_stream_runs_is_held_no_longer_once_it_ends(build_dir,
                                                                             tmp_path, certs):
    # The stream's handler waits on a slow upstream; meanwhile a record comes without its last
    # byte. Once the answer is out, the connection is idle with part of a record in OpenSSL:
    # the keep-alive timeout (1 s) applies, as to any idle connection.
    from proxy_support import upstream
    slow = upstream(build_dir, "slow")
    server = serve(build_dir, tmp_path, certs, extra=f"""
routes:
  - {{name: slow, match: {{path_prefix: /delay/}}, service: slow}}
services:
  slow: {{url: "http://127.0.0.1:{slow.port}"}}
""")
    try:
        c = RawTls(server, ["h2"])
        conn, first = h2_preface_and_get("/delay/1500")
        c.sock.sendall(c.record(first))
        time.sleep(0.3)  # the stream is open, its handler waiting
        conn.ping(b"87654321")
        record = c.record(conn.data_to_send())
        c.sock.sendall(record[:-1])
        c.read_until(b"late")  # the answer (/delay/MS says "late") comes
        answered = time.monotonic()
        assert closed_within(c.sock, 6), "held after its last stream ended"
        assert time.monotonic() - answered < 6
        c.close()
    finally:
        assert server.stop() == 0
        slow.stop()


# ---- handshakes: a deadline for the whole, ALPN odd ------------------------------------------


def tls_server(build_dir, tmp_path, certs, handshake="1s", http2="true"):
    config = tmp_path / "tls.yaml"
    config.write_text(f"""
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: off
    http2: {http2}
    timeouts: {{handshake: {handshake}, keepalive: 5s, header: 5s}}
    tls: {{cert: {certs}/localhost.pem, key: {certs}/localhost.key}}
""")
    return Server([spindle_bin(build_dir), "serve", "--config", str(config), "--threads", "1"])


def client_hello():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return tls, incoming, outgoing, outgoing.read()


def test_a_client_hello_trickled_byte_by_byte_is_cut_at_the_handshake_deadline(build_dir,
                                                                             tmp_path, certs):
    """A byte every 200 ms (each read arrives well within any per-read timeout): the handshake
    timeout (1 s) bounds the whole handshake, not each read."""
    server = tls_server(build_dir, tmp_path, certs)
    try:
        _, _, _, hello = client_hello()
        s = socket.create_connection((server.host, server.port), timeout=5)
        start = time.monotonic()
        closed_at = None
        for byte in hello:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic()
                break
            if closed_within(s, 0.2):
                closed_at = time.monotonic()
                break
            if time.monotonic() - start > 8:
                break
        s.close()
        assert closed_at is not None, "held for 8 s of a trickled handshake"
        assert closed_at - start < 1 + 1.5, f"closed after {closed_at - start:.1f} s"
    finally:
        assert server.stop() == 0


def test_a_client_that_stops_after_the_servers_flight_is_cut_at_the_handshake_deadline(
        build_dir, tmp_path, certs):
    """The ClientHello whole, the server's answer read, the client's Finished never sent."""
    server = tls_server(build_dir, tmp_path, certs)
    try:
        held = []
        for _ in range(5):
            tls, incoming, outgoing, hello = client_hello()
            s = socket.create_connection((server.host, server.port), timeout=5)
            s.sendall(hello)
            incoming.write(s.recv(65536))
            held.append(s)
        start = time.monotonic()
        open_ones = [s for s in held if not closed_within(s, 3 - (time.monotonic() - start))]
        assert open_ones == [], f"{len(open_ones)} of 5 held past the handshake timeout"
        for s in held:
            s.close()
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("alpn", [["foo"], ["http/1.0"], ["http/1.1", "foo"], ["", "h2c"]],
                         ids=["foo", "http1.0", "http1.1+foo", "odd"])
def test_http2_only_never_answers_http1_whatever_alpn_offers(build_dir, tmp_path, certs, alpn):
    server = tls_server(build_dir, tmp_path, certs, handshake="5s", http2="only")
    try:
        try:
            c = RawTls(server, [p for p in alpn if p])
        except (ssl.SSLError, ConnectionError, OSError):
            return  # refused in the handshake: never answered in HTTP/1.1
        c.sock.sendall(c.record(b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"))
        try:
            plain = c.read_until(b"\r\n\r\n", seconds=3)
        except (ConnectionError, OSError, ssl.SSLError) as e:
            plain = str(e).encode()
        assert b"HTTP/1" not in plain and b"Hello" not in plain, plain
        c.close()
        # And still serving HTTP/2.
        c = RawTls(server, ["h2"])
        _, first = h2_preface_and_get()
        c.sock.sendall(c.record(first))
        c.read_until(b"Hello, World!")
        c.close()
    finally:
        assert server.stop() == 0


def test_renegotiation_asked_by_a_tls12_client_is_refused_and_costs_nothing(build_dir, tmp_path,
                                                                           certs):
    """`openssl s_client -tls1_2` asks for renegotiation (R) 20 times on one connection: the
    server refuses (no_renegotiation or a close), never crashes, and serves other clients."""
    server = tls_server(build_dir, tmp_path, certs, handshake="5s")
    try:
        script = "R\n" * 20 + "GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"
        done = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}",
                               "-tls1_2", "-servername", "localhost", "-no_ign_eof"],
                              input=script, capture_output=True, text=True, timeout=20)
        assert server.proc.poll() is None
        # A normal client still gets served.
        ctx = ssl.create_default_context(cafile=f"{certs}/ca.pem")
        with socket.create_connection((server.host, server.port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n")
                got = b""
                while b"Hello, World!" not in got:  # the answer in as many reads as it takes
                    more = s.recv(65536)
                    assert more, f"closed before the answer: {got!r}"
                    got += more
        del done
    finally:
        assert server.stop() == 0
