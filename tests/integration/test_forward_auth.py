"""forward_auth: a sub-request to an auth service (a small Python HTTP server here) decides;
its 2xx lets the request go on with chosen fields copied, anything else is the client's answer
as it is, and an auth service that is down means 503, never a request let through."""
import http.client
import http.server
import socket
import threading

import pytest

from proxy_support import (Auth, SERVER, ScriptedUpstream, addr, auth_config, free_port, gateway,
                           logged, middleware_config_error, request, response_status, wait_until)


class AuthService:
    """Answers GET /verify by the Authorization field it is sent: "Bearer good" 200 with
    X-Auth-User, "Bearer login" 302 to a login page, anything else 401. Remembers the fields
    of each request it got."""

    def __init__(self):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                auth = self.headers.get("Authorization", "")
                if auth == "Bearer good":
                    self.answer(200, b"", [("X-Auth-User", "alice"), ("X-Auth-Other", "no")])
                elif auth == "Bearer login":
                    self.answer(302, b"", [("Location", "https://login.example/?next=x")])
                else:
                    self.answer(401, b"who are you?", [("WWW-Authenticate", 'Bearer realm="x"')])

            def answer(self, status, body, fields):
                self.send_response(status)
                for name, value in fields:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host, self.port = "127.0.0.1", self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def auth_gateway(build_dir, tmp_path, target, auth_address, settings=""):
    return gateway(build_dir, tmp_path, SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - forward_auth: {{service: auth, path: /verify, response_headers: [X-Auth-User]{settings}}}
    service: a
services:
  a: {{url: "http://{addr(target)}"}}
  auth: {{url: "http://{auth_address}", timeouts: {{connect: 1s, first_byte: 2s}}}}
""")


def test_the_auth_service_decides(build_dir, tmp_path, up):
    auth = AuthService()
    gw = auth_gateway(build_dir, tmp_path, up, f"127.0.0.1:{auth.port}")
    try:
        # Allowed: the chosen field of its answer goes upstream, replacing the client's own;
        # the others do not.
        status, _, body = request(gw, "POST", "/headers?x=1", body=b"payload",
                                  headers={"Authorization": "Bearer good",
                                           "X-Auth-User": "mallory"})
        # (the test upstream answers GET /headers only: its 405 still shows it was reached)
        status, _, body = request(gw, "GET", "/headers?x=1",
                                  headers={"Authorization": "Bearer good",
                                           "X-Auth-User": "mallory", "Cookie": "s=1"})
        assert status == 200, body
        text = body.decode().lower()
        assert "x-auth-user: alice\n" in text and "mallory" not in text, text
        assert "x-auth-other" not in text, text
        # What the auth service was told: the client's fields and what the request was.
        path, fields = auth.seen[-1]
        assert path == "/verify"
        assert fields["authorization"] == "Bearer good" and fields["cookie"] == "s=1"
        assert fields["x-forwarded-method"] == "GET"
        assert fields["x-forwarded-uri"] == "/headers?x=1"
        assert fields["x-forwarded-proto"] == "http"
        assert fields["x-forwarded-host"] == f"{gw.host}:{gw.port}"
        assert fields["x-forwarded-for"] == "127.0.0.1"
        assert "content-length" not in auth.seen[-2][1]  # the POST's body stays behind

        # Refused: the auth service's answer, as it is.
        status, headers, body = request(gw, "GET", "/headers", headers={"Authorization": "x"})
        assert status == 401 and body == b"who are you?", (status, body)
        assert headers["WWW-Authenticate"] == 'Bearer realm="x"'
        status, headers, _ = request(gw, "GET", "/headers",
                                     headers={"Authorization": "Bearer login"})
        assert status == 302 and headers["Location"] == "https://login.example/?next=x"
    finally:
        gw.stop()
        auth.stop()


def test_only_the_chosen_client_fields_go_to_the_auth_service(build_dir, tmp_path, up):
    auth = AuthService()
    gw = auth_gateway(build_dir, tmp_path, up, f"127.0.0.1:{auth.port}",
                      settings=", request_headers: [Authorization]")
    try:
        status, _, _ = request(gw, "GET", "/headers",
                               headers={"Authorization": "Bearer good", "Cookie": "s=1"})
        assert status == 200
        _, fields = auth.seen[-1]
        assert fields["authorization"] == "Bearer good" and "cookie" not in fields, fields
        assert fields["x-forwarded-uri"] == "/headers"
    finally:
        gw.stop()
        auth.stop()


def test_an_auth_service_that_is_down_lets_nothing_through(build_dir, tmp_path, up):
    gw = auth_gateway(build_dir, tmp_path, up, f"127.0.0.1:{free_port()}")
    try:
        status, _, body = request(gw, "GET", "/headers", headers={"Authorization": "Bearer good"})
        assert status == 503 and b"authentication service unavailable" in body, (status, body)
        assert logged(gw, "forward_auth: service auth", "answered 503")
    finally:
        gw.stop()


def test_forward_auth_to_a_missing_service_is_a_configuration_error(build_dir, tmp_path):
    err = middleware_config_error(build_dir, tmp_path, "[{forward_auth: {service: nobody}}]")
    assert ("bad.yaml:5: routes[0].middlewares[0].forward_auth.service: no service named "
            "'nobody'") in err, err


# ---- fields the gateway owns: spoofed in a trailer, or left for the auth service to set -----


class RawUpstream(ScriptedUpstream):
    """Keeps every byte it receives; answers 200 once a chunked body's end came."""

    def __init__(self):
        self.data = b""
        super().__init__()

    def handle(self, conn):
        with conn:
            conn.settimeout(3)
            try:
                while chunk := conn.recv(65536):
                    self.data += chunk
                    if self.data.endswith(b"\r\n\r\n") and b"\r\n0\r\n" in self.data:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass


@pytest.mark.parametrize("auth_sets", [True, False])
def test_a_client_cannot_set_what_forward_auth_owns_in_its_head_or_its_trailers(
        build_dir, tmp_path, auth_sets):
    up = RawUpstream()
    auth = Auth(b"HTTP/1.1 200 OK\r\n" + (b"X-Auth-User: alice\r\n" if auth_sets else b"") +
                b"Content-Length: 0\r\n\r\n")
    gw = gateway(build_dir, tmp_path, auth_config(up, auth))
    try:
        with socket.create_connection((gw.host, gw.port), timeout=5) as s:
            s.sendall(b"POST /t HTTP/1.1\r\nHost: x\r\nX-Auth-User: admin\r\n"
                      b"Transfer-Encoding: chunked\r\nTrailer: X-Auth-User\r\n\r\n"
                      b"5\r\nhello\r\n0\r\nX-Auth-User: admin\r\n\r\n")
            assert response_status(s) == 200
        assert wait_until(lambda: b"\r\n0\r\n" in up.data)
        assert b"admin" not in up.data, up.data
        assert (b"x-auth-user: alice" in up.data.lower()) == auth_sets, up.data
    finally:
        gw.stop()
        auth.stop()
        up.stop()
