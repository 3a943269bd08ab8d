"""WebSockets to HTTP/2 services (issue 68, item 7): to an h2c upstream that announced
SETTINGS_ENABLE_CONNECT_PROTOCOL an upgrade goes as an extended CONNECT (RFC 8441), from HTTP/2
clients (extended CONNECT) and HTTP/1.1 ones (Upgrade) alike; to one that did not, as an
HTTP/1.1 upgrade on an HTTP/1.1 connection to the same address; where neither is possible, a 502
and a log line saying why. The upstream is Go's net/http (tests/frameworks/go-ws: h2c, and RFC
8441 with GODEBUG=http2xconnect=1), which tells what it understood of the request and how each
WebSocket ended. The tunnel survives resets, half-closes, windows exhausted both ways and a
stalled neighbour on the shared upstream connection."""
import base64
import json
import os
import socket
import subprocess
import threading
import time

import h2.events
import pytest

from conftest import ROOT, Server
from proxy_support import gateway
from test_protocol_upgrades import H2WebSocket, accept_of, ws_frame, ws_parse

KEY = "dGhlIHNhbXBsZSBub25jZQ=="


@pytest.fixture(scope="module")
def go_ws():
    """Builds the Go WebSocket upstream once (scripts/install-go-ws.sh). Fails, never skips:
    Go is a test dependency (scripts/install-deps.sh test)."""
    done = subprocess.run([os.path.join(ROOT, "scripts", "install-go-ws.sh")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return os.path.join(ROOT, "build/tools/go-ws")


def upstream(go_ws, mode="both", extended_connect=True):
    """The Go upstream: `mode` h1, h2c or both (on one port); RFC 8441 announced or not."""
    env = {"GODEBUG": "http2xconnect=1" if extended_connect else "http2xconnect=0"}
    return Server([go_ws, mode], env=env)


def ended(service, count=1, seconds=5):
    """How the upstream's WebSockets ended, once `count` have."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in list(service.output) if '"ended"' in line]
        if len(lines) >= count:
            return lines
        time.sleep(0.02)
    return [json.loads(line) for line in list(service.output) if '"ended"' in line]


def gateway_for(build_dir, tmp_path, port, protocol="h2c", threads=1):
    """One route, /api stripped, to the upstream at `port` spoken to by `protocol`."""
    return gateway(build_dir, tmp_path, f"""
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: off
routes:
  - name: ws
    match: {{path_prefix: /api}}
    middlewares: [{{strip_prefix: /api}}]
    service: s
services:
  s: {{url: "http://127.0.0.1:{port}", protocol: {protocol}, timeouts: {{idle: 10s}}}}
""", threads=threads)


class H1WebSocket:
    """A WebSocket over HTTP/1.1 (Upgrade), on a raw socket."""

    def __init__(self, host, port, path="/api/ws?x=1"):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: chat.example:8080\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: chat\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            data += chunk
        self.head, _, self.data = data.partition(b"\r\n\r\n")
        self.status = int(self.head.split(b" ")[1]) if self.head else None
        self.closed = False

    def field(self, name):
        for line in self.head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == name.lower().encode():
                return v.strip().decode()
        return None

    def send(self, payload, opcode=2):
        self.sock.sendall(ws_frame(payload, opcode))

    def receive(self, seconds=10):
        deadline = time.monotonic() + seconds
        while ws_parse(self.data) is None:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                self.closed = True
                raise ConnectionError("closed")
            self.data += chunk
        _, payload, self.data = ws_parse(self.data)
        return payload

    def wait_closed(self, seconds=5):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                return True
            if not chunk:
                return True
            self.data += chunk
        return False

    def close(self):
        self.sock.close()


class H2Client(H2WebSocket):
    """H2WebSocket with a text sender (commands) and a default path through /api."""

    def __init__(self, host, port, path="/api/ws?x=1"):
        super().__init__(host, port, path=path)

    def send_text(self, text):
        data = ws_frame(text.encode(), opcode=1)
        self.conn.send_data(self.stream, data)
        self.sock.sendall(self.conn.data_to_send())


def open_ws(kind, server):
    return (H1WebSocket if kind == "h1" else H2Client)(server.host, server.port)


def send_text(ws, text):
    if isinstance(ws, H1WebSocket):
        ws.send(text.encode(), opcode=1)
    else:
        ws.send_text(text)


def send_binary(ws, payload):
    ws.send(payload) if not isinstance(ws, H1WebSocket) else ws.send(payload, opcode=2)


# ---- the request the route judged reaches the upstream, as an extended CONNECT ---------------


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_an_upgrade_to_an_h2c_service_goes_as_extended_connect_with_the_canonical_request(
        build_dir, tmp_path, go_ws, client):
    service = upstream(go_ws)
    server = gateway_for(build_dir, tmp_path, service.port)
    try:
        ws = open_ws(client, server)
        if client == "h1":
            assert ws.status == 101, ws.head
            assert ws.field("Sec-WebSocket-Accept") == accept_of(KEY)
            assert ws.field("Upgrade").lower() == "websocket"
        else:
            assert ws.status == 200, ws.events
        send_text(ws, "info")
        seen = json.loads(ws.receive())
        assert seen["method"] == "CONNECT" and seen["protocol"] == "websocket", seen
        assert seen["proto"] == "HTTP/2.0", seen
        # The route's rewrite, the authority it judged, and the forwarded fields made here.
        assert seen["path"] == "/ws?x=1", seen
        assert seen["host"] == ("chat.example:8080" if client == "h1" else "localhost"), seen
        assert seen["x-forwarded-for"] == "127.0.0.1", seen
        assert seen["x-forwarded-proto"] == "http", seen
        assert seen["x-forwarded-host"] == seen["host"], seen
        assert seen["via"].endswith(" spindle"), seen
        assert seen["sec-websocket-key"] == "", "RFC 8441 §5: no key on an extended CONNECT"
        ws.close()
    finally:
        server.stop()
        service.stop()


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_large_messages_exhaust_the_windows_both_ways_and_arrive_whole(build_dir, tmp_path,
                                                                        go_ws, client):
    service = upstream(go_ws)
    server = gateway_for(build_dir, tmp_path, service.port)
    try:
        ws = open_ws(client, server)
        for size in (1, 125, 126, 65535, 65536, 1_000_000, 3_000_000):
            payload = os.urandom(size)
            send_binary(ws, payload)
            assert ws.receive() == payload, size
        # The upstream stops reading while 3 MB come its way (every window between fills),
        # then goes on: nothing is lost.
        send_text(ws, "pause 1000")
        payload = os.urandom(3_000_000)
        sender = threading.Thread(target=send_binary, args=(ws, payload)) if client == "h1" \
            else None
        if sender:
            sender.start()
        else:
            send_binary(ws, payload)
        assert ws.receive() == b"resumed"
        assert ws.receive() == payload
        if sender:
            sender.join(10)
        send_text(ws, "big 5000000")
        assert ws.receive() == bytes(i % 251 for i in range(5_000_000))
        ws.close()
    finally:
        server.stop()
        service.stop()


# ---- where the upstream allows no extended CONNECT --------------------------------------------


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_without_enable_connect_protocol_the_upgrade_goes_over_http1_to_the_same_upstream(
        build_dir, tmp_path, go_ws, client):
    service = upstream(go_ws, extended_connect=False)
    server = gateway_for(build_dir, tmp_path, service.port)
    try:
        ws = open_ws(client, server)
        assert ws.status == (101 if client == "h1" else 200)
        if client == "h1":
            assert ws.field("Sec-WebSocket-Accept") == accept_of(KEY)
        send_text(ws, "info")
        seen = json.loads(ws.receive())
        assert seen["method"] == "GET" and seen["proto"] == "HTTP/1.1", seen
        assert seen["path"] == "/ws?x=1", seen
        assert seen["x-forwarded-for"] == "127.0.0.1", seen
        payload = os.urandom(200_000)
        send_binary(ws, payload)
        assert ws.receive() == payload
        ws.close()
        assert any("allows no extended CONNECT" in line for line in server.errors), server.errors
    finally:
        server.stop()
        service.stop()


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_neither_extended_connect_nor_http1_is_refused_with_502_and_a_log_line(
        build_dir, tmp_path, go_ws, client):
    service = upstream(go_ws, mode="h2c", extended_connect=False)
    server = gateway_for(build_dir, tmp_path, service.port)
    try:
        ws = open_ws(client, server)
        assert ws.status == 502, getattr(ws, "head", None)
        ws.close()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not any(
                "allows no extended CONNECT (RFC 8441), and over HTTP/1.1" in line
                for line in server.errors):
            time.sleep(0.05)
        assert any("allows no extended CONNECT (RFC 8441), and over HTTP/1.1" in line
                   for line in server.errors), server.errors
    finally:
        server.stop()
        service.stop()


# ---- resets and half-closes -------------------------------------------------------------------


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_a_client_reset_ends_the_upstream_stream(build_dir, tmp_path, go_ws, client):
    service = upstream(go_ws)
    server = gateway_for(build_dir, tmp_path, service.port)
    try:
        ws = open_ws(client, server)
        send_text(ws, "hello")
        assert ws.receive() == b"hello"
        if client == "h2":
            ws.conn.reset_stream(ws.stream)
            ws.sock.sendall(ws.conn.data_to_send())
        else:
            ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            ws.close()
        got = ended(service)
        assert got and got[0]["ended"] == "broken" and got[0]["over"] == "HTTP/2.0", got
        # The upstream connection is still up: the next WebSocket goes on it.
        ws2 = open_ws(client, server)
        send_text(ws2, "again")
        assert ws2.receive() == b"again"
        ws2.close()
        ws.close()
    finally:
        server.stop()
        service.stop()


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_an_upstream_reset_ends_the_client_side(build_dir, tmp_path, go_ws, client):
    service = upstream(go_ws)
    server = gateway_for(build_dir, tmp_path, service.port)
    try:
        ws = open_ws(client, server)
        assert ws.status == (101 if client == "h1" else 200)
        send_text(ws, "first")
        assert ws.receive() == b"first"
        send_text(ws, "reset")
        if client == "h2":
            ws._pump_until(lambda: ws.reset is not None or ws.ended)
            assert ws.reset is not None, "an upstream reset is not passed on as a clean end"
        else:
            assert ws.wait_closed()
        ws.close()
    finally:
        server.stop()
        service.stop()


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_a_half_close_is_passed_on_and_the_answer_after_it_arrives(build_dir, tmp_path, go_ws,
                                                                    client):
    service = upstream(go_ws)
    server = gateway_for(build_dir, tmp_path, service.port)
    try:
        ws = open_ws(client, server)
        send_text(ws, "before")
        assert ws.receive() == b"before"
        if client == "h2":
            ws.conn.end_stream(ws.stream)
            ws.sock.sendall(ws.conn.data_to_send())
            assert ws.receive() == b"eof"
            ws._pump_until(lambda: ws.ended or ws.reset is not None)
            assert ws.ended and ws.reset is None
        else:
            ws.sock.shutdown(socket.SHUT_WR)
            assert ws.receive() == b"eof"
            assert ws.wait_closed()
        got = ended(service)
        assert got and got[0]["ended"] == "eof", got
        ws.close()
    finally:
        server.stop()
        service.stop()


# ---- tunnels sharing one upstream connection --------------------------------------------------


def test_a_stalled_tunnel_does_not_stall_the_others_on_the_shared_upstream_connection(
        build_dir, tmp_path, go_ws):
    service = upstream(go_ws)
    server = gateway_for(build_dir, tmp_path, service.port, threads=1)
    try:
        stalled = H2Client(server.host, server.port)
        # It asks for far more than every window between holds, and reads none of it.
        stalled.send_text("big 20000000")
        time.sleep(0.5)
        others = [open_ws("h2" if i % 2 else "h1", server) for i in range(8)]
        for round_ in range(3):
            for i, ws in enumerate(others):
                payload = os.urandom(300_000 + i)
                send_binary(ws, payload)
                assert ws.receive() == payload, (round_, i)
        for ws in others:
            ws.close()
        stalled.close()
        # One upstream connection carried them all (one worker): Go saw every one over HTTP/2.
        got = ended(service, count=9)
        assert len(got) == 9 and all(g["over"] == "HTTP/2.0" for g in got), got
    finally:
        server.stop()
        service.stop()
