"""The Toxiproxy helper's own promises (tests/integration/toxiproxy.py), which the fault tests
of other areas rely on: bytes pass, each toxic does what its name says, a disabled proxy
refuses on the same port and listens there again, and stop() ends the server by its PID."""
import os
import socket
import socketserver
import threading
import time

import pytest

from toxiproxy import Toxiproxy, toxiproxy  # noqa: F401  (the fixture)


class Echo(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                while data := self.request.recv(65536):
                    self.request.sendall(data)
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self):
        return f"127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address):
        pass  # a connection the proxy reset on purpose


@pytest.fixture
def echo():
    server = Echo()
    yield server
    server.shutdown()
    server.server_close()


def round_trip(port, payload=b"ping", timeout=5.0):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_bytes_pass_both_ways(toxiproxy, echo):
    proxy = toxiproxy.proxy("echo", echo.address)
    payload = os.urandom(200_000)
    assert round_trip(proxy.port, payload) == payload


def test_latency_delays_each_answer_and_its_removal_ends_that(toxiproxy, echo):
    proxy = toxiproxy.proxy("echo", echo.address)
    toxic = proxy.add("latency", latency=300)
    assert proxy.toxics() == [toxic]
    started = time.monotonic()
    assert round_trip(proxy.port) == b"ping"
    assert time.monotonic() - started >= 0.3
    proxy.remove(toxic)
    assert proxy.toxics() == []


def test_a_timeout_toxic_of_zero_swallows_bytes_until_removed_which_closes_its_connections(
        toxiproxy, echo):
    proxy = toxiproxy.proxy("echo", echo.address)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(b"before")
        assert s.recv(16) == b"before"
        stall = proxy.add("timeout", timeout=0)
        s.sendall(b"held")
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(16)
        proxy.remove(stall)
        s.settimeout(5)
        assert s.recv(16) == b""  # the stalled connection is closed, its bytes dropped
    assert round_trip(proxy.port) == b"ping"


def test_reset_peer_resets_the_connection(toxiproxy, echo):
    proxy = toxiproxy.proxy("echo", echo.address)
    proxy.add("reset_peer", timeout=0)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            s.sendall(b"x")
            if not s.recv(16):
                raise ConnectionResetError("closed")


def test_a_disabled_proxy_refuses_and_listens_again_on_the_same_port(toxiproxy, echo):
    proxy = toxiproxy.proxy("echo", echo.address)
    proxy.disable()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    proxy.enable()
    assert round_trip(proxy.port) == b"ping"
    toxiproxy.reset()
    assert proxy.toxics() == []


def test_stop_ends_the_server_by_its_pid(echo):
    server = Toxiproxy()
    pid, port = server.proc.pid, server.port
    server.stop()
    assert server.proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
