"""forward_auth under an auth service's faults: a pooled connection the service closed just as
the GET went out (the keep-alive race) is no reason to refuse a client nor to count against the
service, and a 101 to a GET that offered no upgrade never reaches the client."""
import pytest

from proxy_support import (SERVER, ScriptedUpstream, addr, gateway, h2_connect, h2_events_until,
                           logged, read_request_head, request, request_headers)
import h2.events


class RacingAuth(ScriptedUpstream):
    """Answers the first GET of each connection 200 (kept alive) and closes the connection as
    the next one arrives, unanswered: what an auth service closing an idle connection does
    when spindle's request crosses its close."""

    def __init__(self):
        super().__init__()
        self.answered = 0

    def handle(self, conn):
        with conn:
            got = read_request_head(conn)
            if got is None:
                return
            self.answered += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Auth-User: alice\r\n\r\n")
            read_request_head(conn, got[1])  # the next request: closed under it


class SwitchingAuth(ScriptedUpstream):
    """Answers every GET 101 Switching Protocols, then bytes that are no HTTP."""

    def handle(self, conn):
        with conn:
            if read_request_head(conn) is None:
                return
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
                         b"Upgrade: websocket\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            conn.recv(1)


def auth_gateway(build_dir, tmp_path, target, *auths, health=""):
    targets = ", ".join(f'{{address: "127.0.0.1:{auth.port}"}}' for auth in auths)
    return gateway(build_dir, tmp_path, SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - forward_auth: {{service: auth, path: /verify, response_headers: [X-Auth-User]}}
    service: a
services:
  a: {{url: "http://{addr(target)}"}}
  auth: {{upstream: auth-pool, timeouts: {{connect: 1s, first_byte: 2s}}}}
upstreams:
  auth-pool:
    targets: [{targets}]
    {health}
""")


def h2_get(gw, path):
    """GET `path` over HTTP/2 (prior knowledge): the response's :status."""
    s, conn = h2_connect(gw)
    with s:
        conn.send_headers(1, request_headers(path), end_stream=True)
        s.sendall(conn.data_to_send())
        events = h2_events_until(s, conn, lambda ev: any(
            isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
        for e in events:
            if isinstance(e, h2.events.ResponseReceived):
                return int(dict(e.headers)[b":status"])
    return None


@pytest.mark.parametrize("client", ["http1", "http2"])
def test_a_pooled_connection_closed_under_the_auth_get_is_tried_again(
        build_dir, tmp_path, up, client):
    auths = [RacingAuth(), RacingAuth()]
    # Passive checks that take a target out at its first counted failure (logged): a race
    # booked against the service would show.
    gw = auth_gateway(build_dir, tmp_path, up, *auths,
                      health="health: {passive: {max_fails: 1, fail_timeout: 30s, "
                             "max_ejection_percent: 50}}")
    try:
        for i in range(12):
            if client == "http1":
                status, _, _ = request(gw, "GET", "/headers")
            else:
                status = h2_get(gw, "/headers")
            assert status == 200, (i, list(gw.errors))
        # Each GET after the first met a connection closed under it, then a new one.
        assert sum(auth.answered for auth in auths) == 12
        assert not logged(gw, "forward_auth", seconds=0.2), list(gw.errors)
        assert not logged(gw, "upstream auth-pool", seconds=0.2), list(gw.errors)
    finally:
        gw.stop()
        for auth in auths:
            auth.stop()


@pytest.mark.parametrize("client", ["http1", "http2"])
def test_an_auth_service_switching_protocols_is_refused_with_502(build_dir, tmp_path, up,
                                                                  client):
    auth = SwitchingAuth()
    gw = auth_gateway(build_dir, tmp_path, up, auth)
    try:
        for _ in range(3):
            if client == "http1":
                status, headers, body = request(gw, "GET", "/")
                assert status == 502, (status, body)
                assert b"switched protocols" in body
            else:
                assert h2_get(gw, "/") == 502
        assert logged(gw, "forward_auth", "101", "answered 502")
    finally:
        gw.stop()
        auth.stop()
