"""The gateway forwards the request it judged (issue 67, part 1): one canonical request, made
right after parsing, for HTTP/1.1, HTTP/2 and RFC 8441 alike; what is ambiguous is refused
with a 400 at the edge. One test per numbered item of the issue, each reproducing the attack
as it was found, against an upstream that records every byte it receives (what the service
behind the gateway understood is tests/integration/test_framework_upstreams.py's)."""
import base64
import json
import re
import time

import h2.events
import pytest

from proxy_support import (RecordingUpstream, gateway, h2_connect, h2_events_until, raw,
                           request_headers, wait_until)

ALICE = "Basic " + base64.b64encode(b"alice:secret").decode()
# htpasswd -s: alice / secret
HTPASSWD = "alice:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=\n"


@pytest.fixture
def recorder():
    upstream = RecordingUpstream()
    yield upstream
    upstream.stop()


def config(upstream, routes, server_extra="", services_extra=""):
    return f"""
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: off
{server_extra}
routes:
{routes}
services:
  s: {{url: "http://127.0.0.1:{upstream.port}"}}
{services_extra}
"""


def status_of(reply):
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else None


def send(server, head):
    """One HTTP/1.1 request (a head with no body) on its own connection: the status."""
    assert head.endswith("\r\n\r\n")
    head = head[:-2] + "Connection: close\r\n\r\n"
    return status_of(raw(server, head.encode("latin-1"), wait=5))


def upstream_heads(upstream):
    return [h.decode("latin-1") for h, _ in upstream.requests]


def fields_named(head, name):
    return re.findall(rf"(?im)^{re.escape(name)}: *([^\r]*)", head)


def h2_statuses(server, streams):
    """Sends each (headers) of `streams` as a request of its own on one HTTP/2 connection:
    their statuses, in order."""
    s, conn = h2_connect(server)
    ids = []
    for headers in streams:
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, headers, end_stream=True)
        ids.append(stream)
    s.sendall(conn.data_to_send())
    events = h2_events_until(s, conn, lambda ev: sum(
        isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev) >= len(ids))
    s.close()
    got = {e.stream_id: int(dict(e.headers)[b":status"]) for e in events
           if isinstance(e, h2.events.ResponseReceived)}
    return [got.get(i) for i in ids]


def htpasswd(tmp_path):
    path = tmp_path / "users"
    path.write_text(HTPASSWD)
    return path


# ---- 1: absolute-form targets ---------------------------------------------------------------


def test_an_absolute_form_target_is_routed_on_its_authority_and_sent_in_origin_form(
        build_dir, tmp_path, recorder):
    routes = f"""  - name: admin
    match: {{path_prefix: /admin}}
    middlewares: [{{basic_auth: {{users_file: {htpasswd(tmp_path)}}}}}]
    service: s
  - name: internal
    match: {{hosts: [admin.internal]}}
    middlewares: [{{basic_auth: {{users_file: {htpasswd(tmp_path)}}}}}]
    service: s
  - {{name: public, match: {{path_prefix: /}}, service: s}}
"""
    server = gateway(build_dir, tmp_path, config(recorder, routes))
    try:
        # The path of an absolute-form target is what routes: /admin needs credentials.
        assert send(server, "GET http://app.example.com/admin/users HTTP/1.1\r\n"
                            "Host: app.example.com\r\n\r\n") == 401
        assert send(server, "GET HTTP://app.example.com/%61dmin/users HTTP/1.1\r\n"
                            "Host: app.example.com\r\n\r\n") == 401
        # Its authority is the request's: it routes, and no Host may say otherwise.
        assert send(server, "GET http://admin.internal/secret HTTP/1.1\r\n"
                            "Host: public.com\r\n\r\n") == 400
        assert send(server, "GET http://admin.internal/secret HTTP/1.1\r\n"
                            "Host: admin.internal\r\n\r\n") == 401
        assert recorder.requests == []
        # What goes upstream is origin-form, with Host the authority.
        assert send(server, "GET http://app.example.com/public/x?y=1 HTTP/1.1\r\n"
                            "Host: app.example.com\r\n\r\n") == 200
        head = upstream_heads(recorder)[-1]
        assert head.startswith("GET /public/x?y=1 HTTP/1.1\r\n"), head
        assert fields_named(head, "host") == ["app.example.com"], head
        assert fields_named(head, "x-forwarded-host") == ["app.example.com"], head
        # No path at all, or only a query: the root.
        assert send(server, "GET http://app.example.com HTTP/1.1\r\nHost: app.example.com\r\n"
                            "\r\n") == 200
        assert upstream_heads(recorder)[-1].startswith("GET / HTTP/1.1\r\n")
        assert send(server, "GET http://app.example.com?q HTTP/1.1\r\nHost: app.example.com"
                            "\r\n\r\n") == 200
        assert upstream_heads(recorder)[-1].startswith("GET /?q HTTP/1.1\r\n")
        # Another scheme, user information, or no authority: refused.
        for target in ("ftp://app.example.com/x", "http://alice@app.example.com/x",
                       "http:///x", "http://app.example.com:99999/x"):
            assert send(server, f"GET {target} HTTP/1.1\r\nHost: app.example.com\r\n\r\n") \
                == 400, target
    finally:
        server.stop()


# ---- 2: forward_auth sees only the gateway's X-Forwarded-* ----------------------------------


class Decider(RecordingUpstream):
    """An auth service that lets through what its X-Forwarded-Uri (the first, as auth services
    read it) says is under /public."""

    def answer(self, head, body):
        uri = fields_named(head.decode("latin-1"), "x-forwarded-uri")
        ok = bool(uri) and uri[0].startswith("/public")
        return (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" if ok else
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")


def test_the_auth_service_is_told_only_what_the_gateway_judged(build_dir, tmp_path, recorder):
    decider = Decider()
    routes = """  - name: all
    match: {path_prefix: /}
    middlewares: [{forward_auth: {service: auth, path: /verify}}]
    service: s
"""
    server = gateway(build_dir, tmp_path, config(
        recorder, routes, services_extra=f'  auth: {{url: "http://127.0.0.1:{decider.port}"}}'))
    try:
        for spelling in ("X-Forwarded-Uri", "x-forwarded-uri", "X_Forwarded_Uri"):
            got = send(server, f"GET /admin/secret HTTP/1.1\r\nHost: a\r\n"
                               f"{spelling}: /public/x\r\nX-Forwarded-Method: GET\r\n\r\n")
            assert got in (400, 403), (spelling, got)
        assert recorder.requests == []
        for head in upstream_heads(decider):
            for name in ("x-forwarded-uri", "x-forwarded-method", "x-forwarded-host",
                         "x-forwarded-proto", "x-forwarded-for"):
                assert len(fields_named(head, name)) == 1, (name, head)
            assert fields_named(head, "x-forwarded-uri") == ["/admin/secret"], head
        assert send(server, "GET /public/x HTTP/1.1\r\nHost: a\r\n\r\n") == 200
    finally:
        server.stop()
        decider.stop()


# ---- 3: singleton fields --------------------------------------------------------------------


def test_two_authorization_fields_are_refused(build_dir, tmp_path, recorder):
    routes = f"""  - name: all
    match: {{path_prefix: /}}
    middlewares: [{{basic_auth: {{users_file: {htpasswd(tmp_path)}}}}}]
    service: s
"""
    server = gateway(build_dir, tmp_path, config(recorder, routes))
    try:
        assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: {ALICE}\r\n\r\n") == 200
        for second in ("Authorization: Bearer forged", "authorization: Basic Zm9vOmJhcg==",
                       f"AUTHORIZATION: {ALICE}"):
            assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: {ALICE}\r\n"
                                f"{second}\r\n\r\n") == 400, second
        for second in ("Content-Type: text/html", "Host: b", "Range: bytes=0-1",
                       "User-Agent: other"):
            name = second.split(":")[0]
            assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: {ALICE}\r\n"
                                f"{name}: one\r\n{second}\r\n\r\n") == 400, second
        assert len(recorder.requests) == 1
        # HTTP/2 alike.
        auth = [("authorization", ALICE)]
        assert h2_statuses(server, [request_headers("/x") + auth,
                                    request_headers("/x") + auth + auth]) == [200, 400]
    finally:
        server.stop()


# ---- 4: `_` spellings of the fields the gateway owns or judges ------------------------------


JWT_SECRET = b"k" * 32


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256(claims, header=None):
    import hashlib
    import hmac
    head = b64url(json.dumps(header or {"alg": "HS256", "kid": "k"}).encode())
    body = b64url(json.dumps({"exp": int(time.time()) + 300, **claims}).encode())
    mac = hmac.new(JWT_SECRET, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(mac)}"


def jwt_routes(tmp_path, settings=""):
    (tmp_path / "keys.json").write_text(json.dumps(
        {"keys": [{"kty": "oct", "kid": "k", "k": b64url(JWT_SECRET)}]}))
    return f"""  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - jwt: {{jwks_file: {tmp_path / 'keys.json'}, claims_to_headers: {{role: X-Role}}{settings}}}
    service: s
"""


def test_underscore_spellings_of_owned_and_judged_fields_are_refused(build_dir, tmp_path,
                                                                    recorder):
    server = gateway(build_dir, tmp_path, config(recorder, jwt_routes(tmp_path),
                                                 server_extra="    trusted_proxies: [10.0.0.0/8]"))
    token = hs256({"sub": "bob", "role": "user"})
    try:
        base = f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n"
        assert send(server, base + "\r\n") == 200
        assert fields_named(upstream_heads(recorder)[-1], "x-role") == ["user"]
        for field in ("X_Role: admin", "x_role: admin", "X-Role: admin\r\nX_ROLE: admin",
                      "X_Forwarded_For: 10.0.0.1", "X_Real_IP: 10.0.0.1",
                      "X_Forwarded_Host: admin.example", "Content_Length: 5",
                      "Transfer_Encoding: chunked", "X_Request_Id: forged"):
            assert send(server, base + field + "\r\n\r\n") == 400, field
        assert len(recorder.requests) == 1
        # A field the gateway has no rule for may have one.
        assert send(server, base + "X_Custom: 1\r\n\r\n") == 200
        # HTTP/2 alike.
        auth = [("authorization", f"Bearer {token}")]
        assert h2_statuses(server, [request_headers("/x") + auth,
                                    request_headers("/x") + auth + [("x_role", "admin")]]) \
            == [200, 400]
    finally:
        server.stop()


# ---- 5: the jwt cookie ----------------------------------------------------------------------


def test_two_cookies_of_the_jwt_cookies_name_are_refused(build_dir, tmp_path, recorder):
    server = gateway(build_dir, tmp_path,
                     config(recorder, jwt_routes(tmp_path, settings=", cookie: token")))
    good = hs256({"sub": "bob", "role": "user"})
    forged = b64url(b'{"alg":"none"}') + "." + b64url(b'{"sub":"admin","role":"admin"}') + "."
    try:
        assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nCookie: token={good}\r\n\r\n") == 200
        # Frameworks read the first cookie of a name: the one the gateway verifies must be it,
        # so two (in one field, in two, in any order) are refused.
        for cookies in (f"token={forged}; token={good}", f"token={good}; token={forged}",
                        f"a=1; token={forged}\r\nCookie: token={good}"):
            assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nCookie: {cookies}\r\n\r\n") \
                == 400, cookies
        assert len(recorder.requests) == 1
        # One spelt otherwise than "token=" alone: Express trims names, PHP decodes them.
        for cookies in (f"token ={good}", f"%74oken={good}", f"token\t={good}"):
            assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nCookie: {cookies}\r\n\r\n") \
                == 400, cookies
        assert len(recorder.requests) == 1
        # A cookie of another name that ends with it is another cookie.
        assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nCookie: xtoken={forged}; "
                            f"token={good}\r\n\r\n") == 200
    finally:
        server.stop()


# ---- 6: method spellings ----------------------------------------------------------------------


def test_standard_methods_in_any_case_are_judged_and_forwarded_upper_case(build_dir, tmp_path,
                                                                          recorder):
    routes = f"""  - name: writes
    match: {{path_prefix: /api, methods: [PUT, POST, PATCH]}}
    middlewares: [{{basic_auth: {{users_file: {htpasswd(tmp_path)}}}}}]
    service: s
  - {{name: reads, match: {{path_prefix: /api}}, service: s}}
"""
    server = gateway(build_dir, tmp_path, config(recorder, routes))
    try:
        for method in ("put", "Post", "pATCH", "PUT"):
            assert send(server, f"{method} /api/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0"
                                "\r\n\r\n") == 401, method
        assert recorder.requests == []
        assert send(server, f"patch /api/x HTTP/1.1\r\nHost: a\r\nAuthorization: {ALICE}\r\n"
                            "Content-Length: 0\r\n\r\n") == 200
        assert upstream_heads(recorder)[-1].startswith("PATCH /api/x HTTP/1.1\r\n")
        assert send(server, "get /api/x HTTP/1.1\r\nHost: a\r\n\r\n") == 200
        assert upstream_heads(recorder)[-1].startswith("GET /api/x HTTP/1.1\r\n")
        # A method of no standard, spelt with lower case: which would the upstream run? Refused.
        assert send(server, "purge /api/x HTTP/1.1\r\nHost: a\r\n\r\n") == 400
        assert send(server, "PURGE /api/x HTTP/1.1\r\nHost: a\r\n\r\n") == 200
        # HTTP/2 alike.
        assert h2_statuses(server, [request_headers("/api/x", method="put"),
                                    request_headers("/api/x", method="Purge")]) == [401, 400]
    finally:
        server.stop()


# ---- 7: Host is validated -------------------------------------------------------------------


BAD_HOSTS = ["good.com:443@evil.com", "evil.com/.good.com", "evil.com#.good.com",
             "evil.com?.good.com", "evil.com\\.good.com", "good.com:", "good.com:80:80",
             "good.com:8o", "[::1", "evil.com%2f.good.com", "a b", "good.com,evil.com",
             "good.com:65536"]


def test_an_authority_that_is_not_host_and_port_is_refused(build_dir, tmp_path, recorder):
    routes = """  - name: good
    match: {hosts: [good.com, "*.good.com"], path_prefix: /go}
    middlewares: [{redirect: {scheme: https}}]
    service: s
  - {name: all, match: {path_prefix: /}, service: s}
"""
    server = gateway(build_dir, tmp_path, config(recorder, routes))
    try:
        for host in BAD_HOSTS:
            assert send(server, f"GET /go HTTP/1.1\r\nHost: {host}\r\n\r\n") == 400, host
        got = raw(server, b"GET /go/x HTTP/1.1\r\nHost: www.good.com:8080\r\n\r\n", wait=2)
        assert status_of(got) == 302 and b"\r\nLocation: https://www.good.com/go/x\r\n" in got
        for host in ("good.com", "GOOD.com.", "127.0.0.1:8080", "[::1]:80", "a-b_c.good.com"):
            assert send(server, f"GET /x HTTP/1.1\r\nHost: {host}\r\n\r\n") == 200, host
        assert len(recorder.requests) == 5
        # HTTP/2's :authority alike.
        assert h2_statuses(server, [request_headers("/x", authority=h) for h in BAD_HOSTS[:4]]) \
            == [400] * 4
    finally:
        server.stop()


# ---- 10: the jwt challenge ------------------------------------------------------------------


def test_the_jwt_challenge_names_no_value_the_client_chose(build_dir, tmp_path, recorder):
    server = gateway(build_dir, tmp_path, config(recorder, jwt_routes(tmp_path)))
    try:
        alg = 'x", error="insufficient_scope", realm="evil'
        token = hs256({"sub": "bob"}, header={"alg": alg, "kid": "k"})
        got = raw(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n"
                          "Connection: close\r\n\r\n".encode(), wait=2)
        assert status_of(got) == 401, got
        challenge = re.search(rb"(?im)^www-authenticate: ([^\r]*)", got).group(1).decode()
        assert challenge == ('Bearer realm="spindle", error="invalid_token", '
                             'error_description="algorithm not accepted"'), challenge
        assert "evil" not in got.decode("latin-1")
    finally:
        server.stop()


# ---- 12: RFC 8441 WebSockets ----------------------------------------------------------------


def test_an_http2_websocket_goes_upstream_with_its_authority_as_host(build_dir, tmp_path):
    from test_protocol_upgrades import H2WebSocket, SwitchingUpstream
    upstream = SwitchingUpstream()
    routes = "  - {name: all, match: {path_prefix: /}, service: s}\n"
    server = gateway(build_dir, tmp_path, config(upstream, routes))
    try:
        ws = H2WebSocket(server.host, server.port, path="/chat?room=1")
        assert ws.status == 200
        ws.close()
        head = upstream.heads[-1].decode("latin-1")
        assert head.startswith("GET /chat?room=1 HTTP/1.1\r\n"), head
        assert fields_named(head, "host") == ["localhost"], head
        assert fields_named(head, "x-forwarded-host") == ["localhost"], head
    finally:
        server.stop()
        upstream.stop()


# ---- what an attacker tried next (kept as tests) ------------------------------------------------


class HeadAwareUpstream(RecordingUpstream):
    """Answers as real servers do: a HEAD (in any spelling: Werkzeug upper-cases the method)
    gets the length of the body it would have, and no body."""

    def answer(self, head, body):
        method = head.split(b" ", 1)[0]
        text = b"twelve bytes"
        if method.upper() == b"HEAD":
            return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(text)
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text)


def test_a_head_in_lower_case_is_a_head_on_both_sides(build_dir, tmp_path):
    # "head" forwarded as sent: the upstream answers a HEAD (a length, no body), the gateway
    # waits for a body the upstream never sends, and the next answer on the connection is read
    # as this one's body. Canonical, it is HEAD everywhere.
    upstream = HeadAwareUpstream()
    server = gateway(build_dir, tmp_path, config(
        upstream, "  - {name: all, match: {path_prefix: /}, service: s}\n"))
    try:
        got = raw(server, b"head /a HTTP/1.1\r\nHost: a\r\n\r\n"
                          b"GET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", wait=5)
        first, _, rest = got.partition(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200") and b"Content-Length: 12" in first, got
        assert rest.startswith(b"HTTP/1.1 200") and rest.endswith(b"\r\n\r\ntwelve bytes"), got
        assert [h.split(b" ", 1)[0] for h, _ in upstream.requests] == [b"HEAD", b"GET"]
    finally:
        server.stop()
        upstream.stop()


def test_a_route_method_is_read_as_a_requests_is(build_dir, tmp_path):
    from proxy_support import config_error
    bad = tmp_path / "bad.yaml"
    bad.write_text("""servers:
  - {listen: 127.0.0.1:0}
routes:
  - {match: {methods: [put, purge]}, service: s}
services:
  s: {url: "http://127.0.0.1:9"}
""")
    err = config_error(build_dir, bad)
    assert "bad.yaml:4: routes[0].match.methods: 'purge' is not a method" in err, err


def test_every_copy_of_a_request_carries_one_id_and_no_claim_of_the_client(build_dir, tmp_path,
                                                                           recorder):
    # (The access log is off: no id is noted for it as the request is routed.)
    auth, copies = RecordingUpstream(), RecordingUpstream()
    routes = """  - name: auth
    match: {path_prefix: /a}
    middlewares: [{forward_auth: {service: auth}}]
    service: s
  - name: mirrored
    match: {path_prefix: /m}
    middlewares: [{mirror: {service: copies}}]
    service: s
"""
    server = gateway(build_dir, tmp_path, config(recorder, routes, services_extra=(
        f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}\n'
        f'  copies: {{url: "http://127.0.0.1:{copies.port}"}}')))
    claims = ["X-HTTP-Method-Override: DELETE", "X-Original-URL: /admin", "X-Rewrite-URL: /admin",
              "Forwarded: for=10.0.0.1;host=admin", "X-Real-IP: 10.0.0.1",
              "X-Forwarded-Port: 443", "X-Forwarded-Prefix: /admin", "X-Forwarded-Ssl: on",
              "X-Method-Override: DELETE", "X-Original-Method: DELETE"]
    try:
        for path, other in (("/a", auth), ("/m", copies)):
            assert send(server, f"GET {path} HTTP/1.1\r\nHost: a\r\n" + "".join(
                f"{c}\r\n" for c in claims) + "\r\n") == 200
            assert wait_until(lambda: other.requests)
            heads = [upstream_heads(u)[-1] for u in (recorder, other)]
            ids = [fields_named(h, "x-request-id") for h in heads]
            assert len(ids[0]) == 1 and ids[0] == ids[1], (path, heads)
            for head in heads:
                for claim in claims:
                    assert fields_named(head, claim.split(":")[0]) == [], (claim, head)
    finally:
        server.stop()
        auth.stop()
        copies.stop()
