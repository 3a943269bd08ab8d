"""Upgrades by permission: h2c smuggling closed, WebSocket by route, a 101 checked before a
tunnel opens, CONNECT only by a route that names it; and WebSockets from HTTP/2 clients (RFC
8441 extended CONNECT) to a real WebSocket upstream (python3-websockets), over h2c and TLS."""
import asyncio
import base64
import hashlib
import os
import re
import socket
import ssl
import struct
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
import websockets

from proxy_support import (RecordingUpstream, ScriptedUpstream, config_error, gateway, raw,
                           read_request_head)
from conftest import memory_kib

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def accept_of(key):
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()


def gateway_to(build_dir, tmp_path, port, route_extra="", server_extra="", tls_block="",
               http2="true", match="{path_prefix: /}"):
    return gateway(build_dir, tmp_path, f"""
servers:
  - listen: 127.0.0.1:0
    http2: {http2}
    access_log: off
{server_extra}{tls_block}
routes:
  - name: all
    match: {match}
    service: s
{route_extra}
services:
  s: {{url: "http://127.0.0.1:{port}", timeouts: {{idle: 5s}}}}
""")


# ---- an upstream that would switch to anything -------------------------------------------------


class SwitchingUpstream(ScriptedUpstream):
    """Answers 101 to any Upgrade it is offered (as Go's h2c handler does), with the Accept it
    is told to send, then records every byte that follows. Without an Upgrade, a plain 200 —
    or, with `always`, a 101 anyway."""

    def __init__(self, accept=None, always=False, protocol=None):
        self.heads = []
        self.after = b""
        self.accept = accept
        self.always = always
        self.protocol = protocol
        super().__init__()

    def handle(self, conn):
        data = b""
        try:
            while True:
                got = read_request_head(conn, data)
                if got is None:
                    return
                head, data = got
                self.heads.append(head)
                offered = re.search(rb"(?im)^upgrade: *([^\r]+)", head)
                if offered or self.always:
                    proto = self.protocol or (offered.group(1).split(b",")[0].strip()
                                              if offered else b"h2c")
                    answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                    answer += b"Upgrade: " + proto + b"\r\n"
                    key = re.search(rb"(?im)^sec-websocket-key: *([^\r]+)", head)
                    accept = self.accept if self.accept is not None else (
                        accept_of(key.group(1).decode()) if key else None)
                    if accept:
                        answer += b"Sec-WebSocket-Accept: " + accept.encode() + b"\r\n"
                    conn.sendall(answer + b"\r\n")
                    conn.settimeout(2)
                    try:
                        while chunk := conn.recv(65536):
                            self.after += chunk
                    except OSError:
                        pass
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nplain")
        except OSError:
            pass
        finally:
            conn.close()


H2C_REQUEST = (b"GET /pub HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n"
               b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
PREFACE_AND_ADMIN = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                     + b"GET /admin HTTP/1.1\r\n\r\n")


@pytest.mark.parametrize("http2", ["false", "true"])
def test_h2c_smuggling_reaches_nothing(build_dir, tmp_path, http2):
    upstream = SwitchingUpstream()
    server = gateway_to(build_dir, tmp_path, upstream.port, http2=http2)
    try:
        with socket.create_connection((server.host, server.port), timeout=3) as s:
            s.sendall(H2C_REQUEST)
            head = s.recv(65536)
            if http2 == "false":
                assert head.startswith(b"HTTP/1.1 200 OK"), head  # a plain answer, no tunnel
            else:
                # spindle itself speaks h2c here: its own 101, and every stream is routed.
                assert head.startswith(b"HTTP/1.1 101"), head
            s.sendall(PREFACE_AND_ADMIN)
            time.sleep(0.3)
        assert len(upstream.heads) == 1
        sent = upstream.heads[0].lower()
        assert b"upgrade" not in sent and b"http2-settings" not in sent, sent
        assert upstream.after == b""
    finally:
        server.stop()
        upstream.stop()


def test_a_101_nobody_asked_for_is_a_bad_gateway_and_its_connection_is_not_kept(
        build_dir, tmp_path):
    upstream = SwitchingUpstream(always=True)
    server = gateway_to(build_dir, tmp_path, upstream.port, http2="false")
    try:
        for _ in range(2):
            got = raw(server, H2C_REQUEST + PREFACE_AND_ADMIN, wait=3)
            assert got.startswith(b"HTTP/1.1 502"), got[:200]
        assert upstream.after == b""
        assert upstream.accepted == 2  # each 101's connection was closed, not pooled
    finally:
        server.stop()
        upstream.stop()


WS_REQUEST = (f"GET /chat HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
              f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


@pytest.mark.parametrize("accept,protocol,why", [
    ("d3Jvbmcga2V5IGFjY2VwdA==", None, "a WebSocket 101 without the Sec-WebSocket-Accept"),
    ("", None, "a WebSocket 101 without the Sec-WebSocket-Accept"),
    (None, b"h2c", "a 101 to a protocol the request did not offer"),
])
def test_a_101_that_does_not_prove_the_switch_is_a_bad_gateway(build_dir, tmp_path, accept,
                                                                protocol, why):
    upstream = SwitchingUpstream(accept=accept, protocol=protocol)
    server = gateway_to(build_dir, tmp_path, upstream.port)
    try:
        got = raw(server, WS_REQUEST + b"tunnelled?", wait=3)
        assert got.startswith(b"HTTP/1.1 502"), got[:200]
        assert why.encode() in got, got
        assert upstream.after == b""
        # A right one opens the tunnel: the bytes after the head go through.
        good = SwitchingUpstream()
        good_server = gateway_to(build_dir, tmp_path, good.port)
        try:
            got = raw(good_server, WS_REQUEST + b"tunnelled!", wait=1)
            assert got.startswith(b"HTTP/1.1 101"), got[:200]
            assert f"Sec-WebSocket-Accept: {accept_of(KEY)}\r\n".encode() in got
            time.sleep(0.3)
            assert good.after == b"tunnelled!"
        finally:
            good_server.stop()
            good.stop()
    finally:
        server.stop()
        upstream.stop()


def test_an_upgrade_the_route_does_not_allow_goes_on_as_a_plain_request(build_dir, tmp_path):
    upstream = SwitchingUpstream()
    server = gateway_to(build_dir, tmp_path, upstream.port, route_extra="    upgrades: []\n")
    try:
        got = raw(server, WS_REQUEST, wait=2)
        assert got.startswith(b"HTTP/1.1 200 OK"), got[:200]
        sent = upstream.heads[-1].lower()
        assert b"upgrade:" not in sent and b"connection: upgrade" not in sent, sent
        # Several offered, one allowed: only that one goes up.
        server.stop()
        server = gateway_to(build_dir, tmp_path, upstream.port,
                            route_extra="    upgrades: [websocket]\n")
        got = raw(server, WS_REQUEST.replace(b"Upgrade: websocket", b"Upgrade: h2c, foo/2, "
                                             b"WebSocket"), wait=1)
        assert got.startswith(b"HTTP/1.1 101"), got[:200]
        assert re.search(rb"(?im)^upgrade: WebSocket(\r|$)", upstream.heads[-1]), upstream.heads[-1]
    finally:
        server.stop()
        upstream.stop()


def test_connect_is_taken_only_by_a_route_that_names_it(build_dir, tmp_path):
    upstream = RecordingUpstream()
    server = gateway_to(build_dir, tmp_path, upstream.port, match="{}")  # takes any path
    try:
        got = raw(server, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
                  wait=2)
        assert got.split(b"\r\n")[0] in (b"HTTP/1.1 404 Not Found",
                                         b"HTTP/1.1 405 Method Not Allowed"), got[:200]
        assert upstream.targets() == []
    finally:
        server.stop()
        upstream.stop()


def test_h2c_can_never_be_allowed(build_dir, tmp_path):
    config = tmp_path / "h2c.yaml"
    config.write_text("servers:\n  - listen: 127.0.0.1:0\nroutes:\n  - match: {}\n"
                      "    upgrades: [websocket, h2c]\n    service: s\n"
                      "services:\n  s: {url: \"http://127.0.0.1:9\"}\n")
    error = config_error(build_dir, config)
    assert re.search(r"h2c.yaml:5: routes\[0\]\.upgrades: h2c can never be allowed", error), error


# ---- WebSocket over HTTP/2 (RFC 8441) to a real WebSocket server --------------------------------


class EchoServer:
    """python3-websockets echoing every message, on a thread of its own. `closes` holds the
    close codes its connections saw."""

    def __init__(self):
        self.closes = []
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self._run, daemon=True).start()
        assert self.ready.wait(5)

    async def _echo(self, ws, path=None):
        try:
            async for message in ws:
                await ws.send(message)
        finally:
            self.closes.append(ws.close_code)

    def _run(self):
        asyncio.set_event_loop(self.loop)

        async def main():
            self.server = await websockets.serve(self._echo, "127.0.0.1", 0, max_size=None,
                                                 compression=None)
            self.port = self.server.sockets[0].getsockname()[1]
            self.ready.set()
            await self.server.wait_closed()

        self.loop.run_until_complete(main())

    def stop(self):
        self.loop.call_soon_threadsafe(self.server.close)


def ws_frame(payload, opcode=2):
    """A masked client frame (RFC 6455 5.2)."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if n < 4096 else \
        (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")
         ).to_bytes(n, "big")
    return head + mask + masked


def ws_parse(buffer):
    """(opcode, payload, rest) of the first whole server frame in `buffer`, or None."""
    if len(buffer) < 2:
        return None
    n = buffer[1] & 0x7F
    at = 2
    if n == 126:
        if len(buffer) < 4:
            return None
        n, at = struct.unpack("!H", buffer[2:4])[0], 4
    elif n == 127:
        if len(buffer) < 10:
            return None
        n, at = struct.unpack("!Q", buffer[2:10])[0], 10
    if len(buffer) < at + n:
        return None
    return buffer[0] & 0x0F, buffer[at:at + n], buffer[at + n:]


class H2WebSocket:
    """A WebSocket over one HTTP/2 stream (extended CONNECT), with python-h2."""

    def __init__(self, host, port, path="/chat", tls=None):
        raw_sock = socket.create_connection((host, port), timeout=10)
        if tls:
            ctx = ssl.create_default_context(cafile=tls)
            ctx.set_alpn_protocols(["h2"])
            raw_sock = ctx.wrap_socket(raw_sock, server_hostname="localhost")
        self.sock = raw_sock
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.events = []
        self.data = b""
        self.ended = False
        self.reset = None
        self._pump_until(lambda: self.conn.remote_settings.enable_connect_protocol == 1)
        self.stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(self.stream, [
            (":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
            (":path", path), (":authority", "localhost"), ("sec-websocket-version", "13")])
        self.sock.sendall(self.conn.data_to_send())
        self._pump_until(lambda: self.status is not None)

    @property
    def status(self):
        for e in self.events:
            if isinstance(e, h2.events.ResponseReceived):
                return int(dict(e.headers)[b":status"])
        return None

    def _pump_until(self, done, seconds=10):
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError("nothing came")
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            for e in self.conn.receive_data(chunk):
                self.events.append(e)
                if isinstance(e, h2.events.DataReceived) and e.stream_id == self.stream:
                    self.data += e.data
                    self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                elif isinstance(e, h2.events.StreamEnded) and e.stream_id == self.stream:
                    self.ended = True
                elif isinstance(e, h2.events.StreamReset) and e.stream_id == self.stream:
                    self.reset = e.error_code
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)

    def send(self, payload, end=False):
        data = ws_frame(payload)
        while data:
            window = min(self.conn.local_flow_control_window(self.stream),
                         self.conn.max_outbound_frame_size)
            if window == 0:
                self._pump_until(lambda: self.conn.local_flow_control_window(self.stream) > 0)
                continue
            self.conn.send_data(self.stream, data[:window])
            data = data[window:]
            self.sock.sendall(self.conn.data_to_send())
        if end:
            self.conn.end_stream(self.stream)
            self.sock.sendall(self.conn.data_to_send())

    def receive(self):
        self._pump_until(lambda: ws_parse(self.data) is not None)
        opcode, payload, self.data = ws_parse(self.data)
        return payload

    def close(self):
        self.sock.close()


@pytest.fixture
def echo():
    server = EchoServer()
    yield server
    server.stop()


def test_websocket_over_http2_carries_messages_both_ways(build_dir, tmp_path, echo, certs):
    tls = f"    tls: {{cert: {certs}/localhost.pem, key: {certs}/localhost.key}}\n"
    for tls_block, ca in (("", None), (tls, os.path.join(certs, "ca.pem"))):
        server = gateway_to(build_dir, tmp_path, echo.port, tls_block=tls_block)
        try:
            ws = H2WebSocket(server.host, server.port, tls=ca)
            assert ws.status == 200, ws.events
            response = [e for e in ws.events if isinstance(e, h2.events.ResponseReceived)][0]
            names = {k for k, _ in response.headers}
            assert b"sec-websocket-accept" not in names and b"content-length" not in names
            for size in (1, 125, 126, 65535, 65536, 1_000_000):
                payload = os.urandom(size)
                ws.send(payload)
                assert ws.receive() == payload, size
            ws.close()
        finally:
            server.stop()


def test_a_route_that_does_not_allow_websocket_refuses_the_extended_connect(build_dir, tmp_path,
                                                                             echo):
    server = gateway_to(build_dir, tmp_path, echo.port, route_extra="    upgrades: []\n")
    try:
        ws = H2WebSocket(server.host, server.port)
        assert ws.status == 501
        ws.close()
    finally:
        server.stop()


def test_a_client_reset_or_end_closes_the_upstream_and_an_upstream_close_ends_the_stream(
        build_dir, tmp_path, echo):
    server = gateway_to(build_dir, tmp_path, echo.port)
    try:
        ws = H2WebSocket(server.host, server.port)
        ws.send(b"hello")
        assert ws.receive() == b"hello"
        ws.conn.reset_stream(ws.stream)
        ws.sock.sendall(ws.conn.data_to_send())
        deadline = time.monotonic() + 5
        while len(echo.closes) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(echo.closes) == 1, "the upstream WebSocket was not closed by the reset"
        ws.close()
        # The client's END_STREAM is a half-close: the upstream sees its end and closes; the
        # stream then ends for the client too.
        ws = H2WebSocket(server.host, server.port)
        ws.send(b"bye", end=True)
        ws._pump_until(lambda: ws.ended or ws.reset is not None)
        assert ws.receive() == b"bye" if ws.data else True
        ws.close()
    finally:
        server.stop()


class SinkServer(ScriptedUpstream):
    """A WebSocket upstream that accepts, then never reads."""

    def handle(self, conn):
        got = read_request_head(conn)
        key = re.search(rb"(?im)^sec-websocket-key: *([^\r]+)", got[0]).group(1).decode()
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept_of(key).encode()
                     + b"\r\n\r\n")
        time.sleep(8)
        conn.close()


def test_an_upstream_that_stops_reading_holds_the_client_back_not_memory(build_dir, tmp_path):
    upstream = SinkServer()
    server = gateway_to(build_dir, tmp_path, upstream.port)
    try:
        ws = H2WebSocket(server.host, server.port)
        before = memory_kib(server.proc.pid)
        sent = 0
        chunk = os.urandom(65536)
        deadline = time.monotonic() + 3
        ws.sock.settimeout(0.5)
        try:
            while time.monotonic() < deadline and sent < 64 << 20:
                window = min(ws.conn.local_flow_control_window(ws.stream),
                             ws.conn.max_outbound_frame_size)
                if window == 0:
                    try:
                        ws._pump_until(lambda: ws.conn.local_flow_control_window(ws.stream) > 0,
                                       seconds=0.5)
                    except TimeoutError:
                        continue
                    continue
                ws.conn.send_data(ws.stream, chunk[:window])
                ws.sock.sendall(ws.conn.data_to_send())
                sent += window
        except OSError:
            pass
        grown = (memory_kib(server.proc.pid) - before) // 1024
        print(f"sent {sent >> 10} KiB before flow control stopped it; RSS grew {grown} MiB")
        assert sent < 16 << 20, "flow control never held the client back"
        assert grown < 24, grown
        ws.close()
    finally:
        server.stop()
        upstream.stop()
