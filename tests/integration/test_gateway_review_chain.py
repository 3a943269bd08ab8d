"""An attacker's review of the judged-then-forwarded chain: for each attack, what the gateway
judged (route, identity, fields, path, scheme) against what the upstream, the forward_auth
service or the client then got; every head the client gets against the route's response
edits; reloads under open connections; h2c upstreams and auth services. The second part is
test_gateway_review_chain_judged.py. An attack that holds is
a plain test; one that found a defect is xfail(strict=True) with what was observed, and passes
once it is fixed."""
import base64
import os
import re
import socket
import time

import h2.events
import pytest

from proxy_support import (RecordingUpstream, ScriptedUpstream, gateway, h2_connect,
                           h2_events_until, held_dead_port, raw, read_request_head,
                           request_headers, wait_until)
from test_canonical_request import HTPASSWD, fields_named, send, status_of
from test_protocol_upgrades import H2WebSocket, accept_of


@pytest.fixture
def recorder():
    upstream = RecordingUpstream()
    yield upstream
    upstream.stop()


class AuthService(RecordingUpstream):
    """A forward_auth service: lets every request through, except those it is told are for
    /deny (401 with a field of its own the route's response edits remove)."""

    def answer(self, head, body):
        uri = fields_named(head.decode("latin-1"), "x-forwarded-uri")
        if uri and uri[0].startswith("/deny"):
            return (b"HTTP/1.1 401 Unauthorized\r\nX-Powered-By: authd\r\n"
                    b"X-Frame-Options: ALLOW\r\nContent-Length: 0\r\n\r\n")
        return b"HTTP/1.1 200 OK\r\nX-User: alice\r\nContent-Length: 0\r\n\r\n"


def head_text(upstream, i=-1):
    return upstream.requests[i][0].decode("latin-1")


def upstream_heads_of(upstream):
    return [h.decode("latin-1") for h, _ in upstream.requests]


def gateway_for(build_dir, tmp_path, routes, services, server_extra=""):
    return gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off{server_extra}}}
routes:
{routes}
services:
{services}
""")


def h2_exchange(server, headers, body=b""):
    """One HTTP/2 request on its own connection: (status, response fields as (name, value))."""
    s, conn = h2_connect(server)
    conn.send_headers(1, headers, end_stream=not body)
    if body:
        conn.send_data(1, body, end_stream=True)
    s.sendall(conn.data_to_send())
    events = h2_events_until(s, conn, lambda ev: any(
        isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
    s.close()
    for e in events:
        if isinstance(e, h2.events.ResponseReceived):
            fields = [(n.decode(), v.decode()) for n, v in e.headers]
            return int(dict(fields)[":status"]), fields
    return None, []


# ---- 1: the scheme the client claims --------------------------------------------------------


def test_the_scheme_a_cleartext_client_claims_is_told_to_no_one(build_dir, tmp_path, recorder):
    # Invariant: X-Forwarded-Proto says how the client connected (docs/gateway.md), to the
    # upstream and to the auth service alike. Attack: a cleartext client claims https, by an
    # absolute-form target (HTTP/1.1) or by :scheme (h2c prior knowledge): an app that
    # enforces HTTPS (Flask-Talisman, Express's req.secure behind a proxy) or an auth service
    # that refuses plain http would take the claim.
    auth = AuthService()
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{forward_auth: "
              "{service: auth, path: /verify}}], service: s}")
    services = (f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    try:
        assert send(server, "GET https://a/x HTTP/1.1\r\nHost: a\r\n\r\n") in (200, 400)
        status, _ = h2_exchange(server, [(":method", "GET"), (":path", "/y"),
                                         (":scheme", "https"), (":authority", "a")])
        assert status in (200, 400, None)
        for peer in (recorder, auth):
            for head, _ in peer.requests:
                protos = fields_named(head.decode("latin-1"), "x-forwarded-proto")
                assert protos == ["http"], head
    finally:
        server.stop()
        auth.stop()


# ---- 2: response edits on every head the client gets -------------------------------------------


EDITS = "{headers: {response: {remove: [X-Powered-By], set: {X-Frame-Options: DENY}}}}"


def assert_edited(fields, where):
    lowered = [(n.lower(), v) for n, v in fields]
    assert not any(n == "x-powered-by" for n, _ in lowered), (where, fields)
    assert ("x-frame-options", "DENY") in lowered, (where, fields)
    assert [v for n, v in lowered if n == "x-frame-options"] == ["DENY"], (where, fields)


def h1_fields(reply):
    head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    return int(head[0].split(" ")[1]), [tuple(l.split(": ", 1)) for l in head[1:]]


class NoisySwitch(ScriptedUpstream):
    """Switches to WebSocket with a 101 carrying fields a route's response edits remove or
    set (a framework's X-Powered-By, its own X-Frame-Options)."""

    def __init__(self):
        self.heads = []
        super().__init__()

    def handle(self, conn):
        try:
            got = read_request_head(conn, b"")
            if got is None:
                return
            head, _ = got
            self.heads.append(head)
            key = re.search(rb"(?im)^sec-websocket-key: *([^\r]+)", head)
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                         b"Upgrade: websocket\r\nX-Powered-By: Express\r\n"
                         b"X-Frame-Options: ALLOW\r\nSec-WebSocket-Accept: "
                         + accept_of(key.group(1).decode()).encode() + b"\r\n\r\n")
            conn.settimeout(2)
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
        finally:
            conn.close()


def edited_gateway(build_dir, tmp_path, port):
    routes = f"  - {{name: all, match: {{path_prefix: /}}, middlewares: [{EDITS}], service: s}}"
    return gateway_for(build_dir, tmp_path, routes, f'  s: {{url: "http://127.0.0.1:{port}"}}')


def test_response_edits_reach_the_101_of_an_http1_websocket(build_dir, tmp_path):
    # The 101 is a head the client gets: the route's response edits apply to it as to a 103.
    peer = NoisySwitch()
    server = edited_gateway(build_dir, tmp_path, peer.port)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        reply = raw(server, (f"GET /chat HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\n"
                             f"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                             f"Sec-WebSocket-Key: {key}\r\n\r\n").encode(), wait=1.5)
        status, fields = h1_fields(reply)
        assert status == 101, reply
        assert_edited(fields, 101)
    finally:
        server.stop()
        peer.stop()


def test_response_edits_reach_the_200_of_an_http2_websocket(build_dir, tmp_path):
    # RFC 8441: the upstream's 101 becomes the HTTP/2 client's 200; the edits apply to it.
    peer = NoisySwitch()
    server = edited_gateway(build_dir, tmp_path, peer.port)
    try:
        ws = H2WebSocket(server.host, server.port, path="/chat")
        assert ws.status == 200
        answer = next(e for e in ws.events if isinstance(e, h2.events.ResponseReceived))
        ws.close()
        assert_edited([(n.decode(), v.decode()) for n, v in answer.headers], "h2 200")
    finally:
        server.stop()
        peer.stop()


@pytest.mark.parametrize("case", ["basic_auth", "forward_auth", "respond", "redirect",
                                  "bad_gateway", "jwt", "ip_deny", "rate_limit", "max_body",
                                  "cors"])
@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_response_edits_reach_every_answer_the_gateway_or_a_middleware_makes(
        build_dir, tmp_path, recorder, case, client):
    # "for every answer on the route (a middleware's own 401 or 429 included)": the auth
    # service's refusal carries its own X-Powered-By and X-Frame-Options to remove or set.
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    keys = tmp_path / "keys.json"
    keys.write_text('{"keys": [{"kty": "oct", "k": "' + "A" * 43 + '"}]}')
    auth = AuthService()
    first = {
        "basic_auth": f"{{basic_auth: {{users_file: {users}}}}}",
        "forward_auth": "{forward_auth: {service: auth, path: /verify}}",
        "respond": "{respond: {status: 418, body: tea}}",
        "redirect": "{redirect: {path: /elsewhere}}",
        "bad_gateway": "{headers: {request: {set: {X-A: b}}}}",
        "jwt": f"{{jwt: {{jwks_file: {keys}}}}}",
        "ip_deny": "{ip_deny: [127.0.0.0/8]}",
        "rate_limit": "{rate_limit: {rate: 1/h, burst: 1}}",
        "max_body": "{max_body: 1}",
        "cors": "{cors: {origins: [\"https://a.example\"]}}",
    }[case]
    extra = {"max_body": [("content-length", "5")],
             "cors": [("origin", "https://a.example"), ("access-control-request-method", "GET")]
             }.get(case, [])
    method = {"max_body": "POST", "cors": "OPTIONS"}.get(case, "GET")
    body = "hello" if case == "max_body" else ""
    dead, dead_port = held_dead_port()
    target = dead_port if case == "bad_gateway" else recorder.port
    routes = (f"  - {{name: all, match: {{path_prefix: /}}, middlewares: [{EDITS}, {first}], "
              f"service: s}}")
    services = (f'  s: {{url: "http://127.0.0.1:{target}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    try:
        for _ in range(2 if case == "rate_limit" else 1):
            if client == "h2":
                status, fields = h2_exchange(server, request_headers("/deny", method) + extra,
                                             body.encode())
            else:
                status, fields = h1_fields(raw(server, (
                    f"{method} /deny HTTP/1.1\r\nHost: a\r\n" +
                    "".join(f"{n}: {v}\r\n" for n, v in extra) +
                    "Connection: close\r\n\r\n" + body).encode(), wait=2))
        assert status in (401, 418, 302, 502, 503, 403, 429, 413, 204), (status, fields)
        assert_edited(fields, status)
    finally:
        server.stop()
        auth.stop()
        dead.close()


# ---- 6: reloads under open connections -----------------------------------------------------------


def reload_config(recorder, users, guarded):
    auth = f"middlewares: [{{basic_auth: {{users_file: {users}}}}}], " if guarded else ""
    return f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: all, match: {{path_prefix: /}}, {auth}service: s}}
services:
  s: {{url: "http://127.0.0.1:{recorder.port}"}}
"""


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_a_connection_opened_before_a_reload_is_judged_by_the_new_routes(build_dir, tmp_path,
                                                                          recorder, client):
    # Attack: keep a connection open across the reload that puts basic_auth on the route, and
    # go on sending on it as if nothing changed.
    from test_reload import Gateway
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    gw = Gateway(build_dir, tmp_path, reload_config(recorder, users, False))
    server = gw.server
    s = socket.create_connection((server.host, server.port), timeout=5)
    try:
        if client == "h2":
            from proxy_support import h2_connect as connect
            s.close()
            s, conn = connect(server)

            def ask(stream):
                conn.send_headers(stream, request_headers("/x"), end_stream=True)
                s.sendall(conn.data_to_send())
                events = h2_events_until(s, conn, lambda ev: any(
                    isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset))
                    and e.stream_id == stream for e in ev))
                return next((int(dict(e.headers)[b":status"]) for e in events
                             if isinstance(e, h2.events.ResponseReceived)
                             and e.stream_id == stream), None)
            assert ask(1) == 200
            gw.sighup(reload_config(recorder, users, True))
            assert ask(3) in (401, None)
        else:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            gw.sighup(reload_config(recorder, users, True))
            s.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
            assert status_of(s.recv(65536)) in (401, None)
        assert len(recorder.requests) == 1
    finally:
        s.close()
        gw.stop()


# ---- 7: upgrades through forward_auth; interim heads the gateway writes itself -----------------


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_a_websocket_the_auth_service_refuses_never_opens(build_dir, tmp_path, client):
    # forward_auth is asked about an upgrade as about any request: a refusal reaches the
    # client, the upstream never sees the upgrade, and an accepted one carries the service's
    # X-User, not the client's.
    peer, auth = NoisySwitch(), AuthService()
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{forward_auth: "
              "{service: auth, path: /verify, response_headers: [X-User]}}], service: s}")
    services = (f'  s: {{url: "http://127.0.0.1:{peer.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    try:
        for path, want in (("/deny/chat", 401), ("/chat", None)):
            if client == "h2":
                ws = H2WebSocket(server.host, server.port, path=path)
                status = ws.status
                ws.close()
            else:
                key = base64.b64encode(os.urandom(16)).decode()
                status, _ = h1_fields(raw(server, (
                    f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket"
                    f"\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
                    f"X-User: root\r\n\r\n").encode(), wait=1.0))
            if want:
                assert status == want
        assert len(peer.heads) == 1, peer.heads
        head = peer.heads[0].decode("latin-1")
        assert head.startswith("GET /chat "), head
        assert fields_named(head, "x-user") == ["alice"], head
    finally:
        server.stop()
        peer.stop()
        auth.stop()


class Continuing(RecordingUpstream):
    """Says 100 Continue (with a field of its own) before it reads the body, then 200."""

    def handle(self, conn):
        try:
            got = read_request_head(conn, b"")
            if got is None:
                return
            head, rest = got
            conn.sendall(b"HTTP/1.1 100 Continue\r\nX-Powered-By: php\r\n\r\n")
            length = int(fields_named(head.decode("latin-1"), "content-length")[0])
            while len(rest) < length:
                rest += conn.recv(65536)
            self.requests.append((head, rest))
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Powered-By: php\r\nContent-Length: 2\r\n\r\nok")
        finally:
            conn.close()


def test_the_100_continue_the_client_gets_carries_the_response_edits(build_dir, tmp_path):
    # The 100 is a head the client gets (docs: response edits reach every interim head).
    peer = Continuing()
    server = edited_gateway(build_dir, tmp_path, peer.port)
    try:
        with socket.create_connection((server.host, server.port), timeout=5) as s:
            s.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            interim = s.recv(65536)
            status, fields = h1_fields(interim)
            assert status == 100, interim
            s.sendall(b"body")
            rest = interim.split(b"\r\n\r\n", 1)[1]
            while b"ok" not in rest:
                rest += s.recv(65536)
        assert_edited(fields, 100)
        assert_edited(h1_fields(rest)[1], 200)
    finally:
        server.stop()
        peer.stop()


@pytest.mark.parametrize("path", ["http://admin.internal/x", "https://a/x", "//evil/x",
                                  "admin.internal:80", "/x#frag"])
def test_an_http2_path_that_is_not_origin_form_is_not_forwarded_as_another_target(
        build_dir, tmp_path, recorder, path):
    # RFC 9113 §8.3.1: :path is origin-form (or *). An absolute URI there would give the
    # request a second authority; a fragment, a second target to an upstream.
    routes = "  - {name: all, match: {path_prefix: /}, service: s}"
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}')
    try:
        status, _ = h2_exchange(server, request_headers(path))
        assert status in (None, 400) or all(
            line.split(" ")[1].startswith("/") and "admin.internal" not in line
            and "#" not in line for line in recorder.targets()), recorder.targets()
        for head, _ in recorder.requests:
            assert fields_named(head.decode("latin-1"), "host") == ["a"], head
    finally:
        server.stop()


# ---- 9: an h2c upstream reads what an HTTP/1.1 one would -----------------------------------------


class H2cRecorder(ScriptedUpstream):
    """An h2c (prior knowledge) upstream, python-h2's server side: records each request's
    fields as (name, value) strings, answers 200 'ok'."""

    def __init__(self):
        self.requests = []
        self.trailers = []
        super().__init__()

    def handle(self, sock):
        import h2.config
        import h2.connection
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(
            client_side=False, validate_inbound_headers=False))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        sock.settimeout(10)
        try:
            while data := sock.recv(65536):
                for e in conn.receive_data(data):
                    if isinstance(e, h2.events.RequestReceived):
                        self.requests.append([(n.decode(), v.decode()) for n, v in e.headers])
                    if isinstance(e, h2.events.TrailersReceived):
                        self.trailers.append([(n.decode(), v.decode()) for n, v in e.headers])
                    if isinstance(e, h2.events.DataReceived):
                        conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                    if isinstance(e, h2.events.StreamEnded):
                        conn.send_headers(e.stream_id, [(":status", "200"),
                                                        ("content-length", "2")])
                        conn.send_data(e.stream_id, b"ok", end_stream=True)
                sock.sendall(conn.data_to_send())
        except OSError:
            pass
        finally:
            sock.close()


OWNED_SENT = [("X-Forwarded-For", "6.6.6.6"), ("Forwarded", "for=6.6.6.6;host=admin"),
              ("X-Real-IP", "6.6.6.6"), ("X-Original-URL", "/admin"),
              ("X-HTTP-Method-Override", "DELETE"), ("X-Forwarded-Host", "admin"),
              ("X-Forwarded-Proto", "https"), ("X-Forwarded-Prefix", "/admin"),
              ("Via", "1.1 trusted"), ("X-Role", "admin"), ("X-User", "root"),
              ("TE", "trailers, gzip"), ("Cookie", "a=1"), ("Cookie", "b=2")]


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_an_h2c_upstream_and_its_mirror_get_only_the_fields_the_gateway_judged(build_dir,
                                                                               tmp_path, client):
    from test_gateway_one_request import jwt_keys
    from test_canonical_request import hs256
    h2up, mirror, auth = H2cRecorder(), RecordingUpstream(), AuthService()
    keys = jwt_keys(tmp_path)
    token = hs256({"sub": "alice", "role": "reader", "exp": int(time.time()) + 600})
    routes = (f"  - {{name: all, match: {{path_prefix: /}}, middlewares: [{{jwt: {{jwks_file: "
              f"{keys}, claims_to_headers: {{role: X-Role}}}}}}, {{forward_auth: {{service: "
              f"auth, response_headers: [X-User]}}}}, {{mirror: {{service: copies}}}}], "
              f"service: s}}")
    services = (f'  s: {{url: "http://127.0.0.1:{h2up.port}", protocol: h2c}}\n'
                f'  copies: {{url: "http://127.0.0.1:{mirror.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    try:
        sent = OWNED_SENT + [("Authorization", f"Bearer {token}")]
        if client == "h2":
            # (RFC 9113 §8.2.2: an HTTP/2 te other than "trailers" is malformed.)
            status, _ = h2_exchange(server, request_headers("/p?q=1") + [
                (n.lower(), v) for n, v in sent if n != "TE"])
        else:
            status = send(server, "GET /p?q=1 HTTP/1.1\r\nHost: a\r\n" +
                          "".join(f"{n}: {v}\r\n" for n, v in sent) + "\r\n")
        assert status == 200
        assert wait_until(lambda: mirror.requests and h2up.requests)
        fields = h2up.requests[0]
        one = {n: [v for m, v in fields if m == n] for n, _ in fields}
        assert one[":method"] == ["GET"] and one[":path"] == ["/p?q=1"], fields
        assert one[":authority"] == ["a"] and one.get("host", ["a"]) == ["a"], fields
        assert one["x-forwarded-for"] == ["127.0.0.1"], fields
        assert one["x-forwarded-host"] == ["a"] and one["x-forwarded-proto"] == ["http"], fields
        assert one["x-role"] == ["reader"] and one["x-user"] == ["alice"], fields
        assert one.get("te", ["trailers"]) == ["trailers"], fields
        assert "; ".join(one["cookie"]) == "a=1; b=2", fields
        for name in ("forwarded", "x-real-ip", "x-original-url", "x-http-method-override",
                     "x-forwarded-prefix"):
            assert name not in one, (name, fields)
        assert all("trusted" not in v or v.startswith("1.1 trusted") for v in one["via"])
        mirrored = mirror.requests[0][0].decode("latin-1")
        for name in ("x-role", "x-user", "x-forwarded-for", "x-forwarded-host", "x-request-id"):
            assert fields_named(mirrored, name) == one[name], (name, mirrored, fields)
        assert mirrored.startswith("GET /p?q=1 HTTP/1.1\r\n"), mirrored
    finally:
        server.stop()
        h2up.stop()
        mirror.stop()
        auth.stop()


class H2cSwitch(ScriptedUpstream):
    """An h2c upstream that allows extended CONNECT (RFC 8441) and accepts every one with a
    200 carrying fields the route's response edits remove or set; records each request."""

    def __init__(self):
        self.requests = []
        super().__init__()

    def handle(self, sock):
        import h2.config
        import h2.connection
        import h2.settings
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(
            client_side=False, validate_inbound_headers=False))
        conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL: 1})
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        sock.settimeout(5)
        try:
            while data := sock.recv(65536):
                for e in conn.receive_data(data):
                    if isinstance(e, h2.events.RequestReceived):
                        self.requests.append([(n.decode(), v.decode()) for n, v in e.headers])
                        conn.send_headers(e.stream_id, [
                            (":status", "200"), ("x-powered-by", "go"),
                            ("x-frame-options", "ALLOW")])
                    if isinstance(e, h2.events.DataReceived):
                        conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                sock.sendall(conn.data_to_send())
        except OSError:
            pass
        finally:
            sock.close()


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_a_websocket_to_an_h2c_upstream_is_the_request_judged_and_its_answer_edited(
        build_dir, tmp_path, client):
    # The extended CONNECT to the upstream: its :path after strip_prefix, its :authority the
    # request's; the head the client gets back (101 or 200) with the route's response edits.
    peer = H2cSwitch()
    routes = (f"  - {{name: ws, match: {{path_prefix: /ws}}, middlewares: [{EDITS}, "
              f"{{strip_prefix: /ws}}, {{headers: {{request: {{set: {{X-Tenant: t1}}}}}}}}], "
              f"service: s}}")
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{peer.port}", protocol: h2c}}')
    try:
        if client == "h2":
            ws = H2WebSocket(server.host, server.port, path="/WS/chat?x=1")
            answer = next(e for e in ws.events if isinstance(e, h2.events.ResponseReceived))
            ws.close()
            status = int(dict(answer.headers)[b":status"])
            fields = [(n.decode(), v.decode()) for n, v in answer.headers]
        else:
            key = base64.b64encode(os.urandom(16)).decode()
            status, fields = h1_fields(raw(server, (
                f"GET /WS/chat?x=1 HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
                f"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}"
                f"\r\nX-Tenant: admin\r\n\r\n").encode(), wait=1.0))
        assert status == (200 if client == "h2" else 101), fields
        assert_edited([(n, v) for n, v in fields if not n.startswith(":")], status)
        got = dict(peer.requests[0])
        assert got[":method"] == "CONNECT" and got[":protocol"] == "websocket", got
        assert got[":path"] == "/chat?x=1" and got[":authority"] == "localhost", got
        assert [v for n, v in peer.requests[0] if n == "x-tenant"] == ["t1"], peer.requests
    finally:
        server.stop()
        peer.stop()


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_an_h2c_auth_service_is_told_what_the_gateway_judged(build_dir, tmp_path, recorder,
                                                             client):
    # forward_auth to a service of protocol h2c: the same question as over HTTP/1.1 (the
    # gateway's X-Forwarded-*, the fields the upstream gets, none of the client's owned ones).
    auth = H2cRecorder()
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{headers: {request: {set: "
              "{X-Tenant: t1}}}}, {forward_auth: {service: auth, path: /verify}}], service: s}")
    services = (f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}", protocol: h2c}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    sent = [("X-Forwarded-Uri", "/public"), ("X-Forwarded-Method", "GET"),
            ("X-Forwarded-Host", "public"), ("X-Tenant", "admin"), ("X-Original-URL", "/public")]
    try:
        if client == "h2":
            status, _ = h2_exchange(server, request_headers("/admin/x?y=1", "POST") + [
                (n.lower(), v) for n, v in sent])
        else:
            status = send(server, "POST /admin/x?y=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 0"
                          "\r\n" + "".join(f"{n}: {v}\r\n" for n, v in sent) + "\r\n")
        assert status == 200
        fields = auth.requests[0]
        one = {n: [v for m, v in fields if m == n] for n, _ in fields}
        assert one[":method"] == ["GET"] and one[":path"] == ["/verify"], fields
        assert one["x-forwarded-uri"] == ["/admin/x?y=1"], fields
        assert one["x-forwarded-method"] == ["POST"], fields
        assert one["x-forwarded-host"] == ["a"] and one["x-tenant"] == ["t1"], fields
        assert "x-original-url" not in one and "content-length" not in one, fields
        assert fields_named(head_text(recorder), "x-tenant") == ["t1"]
    finally:
        server.stop()
        auth.stop()


@pytest.mark.parametrize("name", ["x-forwarded-host", "x-forwarded-proto", "x-forwarded-for"])
@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_behind_a_trusted_proxy_the_auth_service_and_upstream_are_told_one_host_and_scheme(
        build_dir, tmp_path, recorder, client, name):
    # A load balancer in trusted_proxies that passes a client's X-Forwarded-Host through (AWS's
    # ALB sets none of its own) lets the client choose it: the auth service must judge the host
    # and scheme the upstream (ProxyFix(x_host=1), Express 'trust proxy') will act on.
    auth = AuthService()
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{forward_auth: "
              "{service: auth}}], service: s}")
    services = (f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services,
                         server_extra=", trusted_proxies: [127.0.0.1]")
    claimed = [("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "admin.example"),
               ("X-Forwarded-For", "9.9.9.9")]
    try:
        if client == "h2":
            status, _ = h2_exchange(server, request_headers("/x") + [
                (n.lower(), v) for n, v in claimed])
        else:
            status = send(server, "GET /x HTTP/1.1\r\nHost: a\r\n" +
                          "".join(f"{n}: {v}\r\n" for n, v in claimed) + "\r\n")
        assert status == 200
        asked, forwarded = head_text(auth), head_text(recorder)
        assert fields_named(forwarded, name) in ([], fields_named(asked, name)), (
            name, asked, forwarded)
    finally:
        server.stop()
        auth.stop()


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_the_auth_service_is_asked_about_a_websocket_with_the_method_the_upstream_gets(
        build_dir, tmp_path, client):
    peer, auth = NoisySwitch(), AuthService()
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{forward_auth: "
              "{service: auth}}], service: s}")
    services = (f'  s: {{url: "http://127.0.0.1:{peer.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    try:
        if client == "h2":
            ws = H2WebSocket(server.host, server.port, path="/chat")
            assert ws.status == 200
            ws.close()
        else:
            key = base64.b64encode(os.urandom(16)).decode()
            reply = raw(server, (f"GET /chat HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
                                 f"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                                 f"Sec-WebSocket-Key: {key}\r\n\r\n").encode(), wait=1.0)
            assert reply.startswith(b"HTTP/1.1 101"), reply
        method = peer.heads[0].split(b" ", 1)[0].decode()
        assert method == "GET", peer.heads
        assert fields_named(head_text(auth), "x-forwarded-method") == [method], head_text(auth)
    finally:
        server.stop()
        peer.stop()
        auth.stop()


class NominatingUpstream(RecordingUpstream):
    """A 103 and a 200 that each name a field of theirs in Connection (hop-by-hop, RFC 9110
    §7.6.1: meant for this hop, the gateway, alone)."""

    def answer(self, head, body):
        return (b"HTTP/1.1 103 Early Hints\r\nConnection: X-Internal\r\nX-Internal: secret\r\n"
                b"Link: </a.css>; rel=preload\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nConnection: X-Internal\r\nX-Internal: secret\r\n"
                b"Content-Length: 2\r\n\r\nok")


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_fields_an_upstream_head_names_in_connection_reach_no_client_head(build_dir, tmp_path,
                                                                          client):
    from test_gateway_one_request import h1_heads, h2_heads
    peer = NominatingUpstream()
    routes = "  - {name: all, match: {path_prefix: /}, service: s}"
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{peer.port}"}}')
    try:
        if client == "h2":
            parts, _ = h2_heads(server, "/x")
        else:
            parts, _ = h1_heads(raw(server, b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                                            b"\r\n").decode("latin-1"))
        assert [status for status, _ in parts] == [103, 200], parts
        # (The gateway's own Connection: close, to a client that asked to close, may stay.)
        for status, fields in parts:
            assert not any(n.lower() == "x-internal" or (
                n.lower() == "connection" and "x-internal" in v.lower()) for n, v in fields), parts
    finally:
        server.stop()
        peer.stop()


class FramedHints(RecordingUpstream):
    """A 103 that carries framing fields (a Content-Length no 1xx may have, RFC 9110 §8.6)."""

    def answer(self, head, body):
        return (b"HTTP/1.1 103 Early Hints\r\nContent-Length: 5\r\nLink: </a.css>; rel=preload"
                b"\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_an_interim_head_reaches_the_client_without_framing_fields(build_dir, tmp_path, client):
    from test_gateway_one_request import h1_heads, h2_heads
    peer = FramedHints()
    routes = "  - {name: all, match: {path_prefix: /}, service: s}"
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{peer.port}"}}')
    try:
        if client == "h2":
            parts, _ = h2_heads(server, "/x")
        else:
            parts, _ = h1_heads(raw(server, b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                                            b"\r\n").decode("latin-1"))
        assert [status for status, _ in parts] in ([103, 200], [200]), parts
        for status, fields in parts[:-1]:
            assert not any(n.lower() in ("content-length", "transfer-encoding")
                           for n, _ in fields), parts
    finally:
        server.stop()
        peer.stop()



def test_a_guarded_route_no_request_can_reach_is_refused_or_named_by_check_config(build_dir,
                                                                                  tmp_path):
    import subprocess
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    config = tmp_path / "shadowed.yaml"
    config.write_text(f"""
servers:
  - {{listen: 127.0.0.1:0}}
routes:
  - name: panel
    match: {{path_regex: "^/panel/$"}}
    middlewares: [{{basic_auth: {{users_file: {users}}}}}]
    service: s
  - {{name: open, match: {{path_prefix: /}}, service: s}}
services:
  s: {{url: "http://127.0.0.1:9"}}
""")
    done = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config",
                           str(config)], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 or "panel" in done.stderr, (done.stdout, done.stderr)
