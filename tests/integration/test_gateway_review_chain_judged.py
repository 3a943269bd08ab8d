"""An attacker's review of the judged-then-forwarded chain, second part (the first is
test_gateway_review_chain.py, whose helpers this one uses): what a route takes against what it
rewrites (path case spellings, a trailing /), host and credential spellings, route paths and
written fields check-config accepts, rate limits against bursts, a second token beside the one
verified, removed fields in other spellings, what follows an answer a middleware made, the
request that upgrades a connection to h2c, reloads while a request is out, TLS scheme claims. An
attack that holds is a plain test; one that found a defect is xfail(strict=True) with what was
observed, and passes once it is fixed."""
import base64
import os
import socket
import time

import h2.events
import pytest

from proxy_support import (RecordingUpstream, gateway, h2_connect, h2_events_until, raw,
                           request_headers, wait_until)
from test_canonical_request import ALICE, HTPASSWD, fields_named, send, status_of
from test_gateway_one_request import spellings as case_spellings
from test_gateway_review_chain import (AuthService, H2cRecorder, gateway_for, h1_fields,
                                       h2_exchange, head_text, upstream_heads_of)


@pytest.fixture
def recorder():
    upstream = RecordingUpstream()
    yield upstream
    upstream.stop()


# ---- 3: path rewrites and the spellings a route takes ------------------------------------------


def test_replace_path_regex_rewrites_every_spelling_its_route_takes(build_dir, tmp_path,
                                                                    recorder):
    # Attack: an upstream that routes without regard to case (Express) serves /API/x as its own
    # /api/x, the path the rewrite was there to keep out of reach.
    mirror = RecordingUpstream()
    rewrite = r'{replace_path_regex: {regex: "^/api/(.*)$", replacement: "/internal/\\1"}}'
    routes = (f"  - {{name: api, match: {{path_prefix: /api/}}, middlewares: [{rewrite}, "
              f"{{mirror: {{service: copies}}}}], service: s}}")
    services = (f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}\n'
                f'  copies: {{url: "http://127.0.0.1:{mirror.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    try:
        for path in [f"/{word}/x" for word in case_spellings("api")] + ["/API/x?q=/api/"]:
            assert send(server, f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n") in (200, 400)
        assert wait_until(lambda: len(mirror.targets()) == len(recorder.targets()))
        for line in recorder.targets() + mirror.targets():
            assert line.startswith("GET /internal/"), (recorder.targets(), mirror.targets())
    finally:
        server.stop()
        mirror.stop()


EXPRESS_ADMIN = """
const express = require('express');
const app = express();
app.get('/admin/', (req, res) => res.send('admin dashboard'));
const server = app.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({address: `127.0.0.1:${server.address().port}`}));
});
"""


def test_a_prefix_with_a_trailing_slash_judges_the_path_express_serves_without_it(build_dir,
                                                                                  tmp_path):
    from conftest import ROOT, Server
    app_file = tmp_path / "admin.js"
    app_file.write_text(EXPRESS_ADMIN)
    app = Server(["node", str(app_file)], env={
        "NODE_PATH": os.path.join(ROOT, "build/tools/express/node_modules")})
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    routes = (f"  - {{name: admin, match: {{path_prefix: /admin/}}, middlewares: [{{basic_auth: "
              f"{{users_file: {users}}}}}], service: s}}\n"
              f"  - {{name: public, match: {{path_prefix: /}}, service: s}}")
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://{app.host}:{app.port}"}}')
    try:
        assert send(server, "GET /admin/ HTTP/1.1\r\nHost: a\r\n\r\n") == 401
        for path in ([f"/{word}" for word in case_spellings("admin")] +
                     ["/admin?x", "/ADMIN?x=/"]):
            reply = raw(server, f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
                        .encode())
            assert b"admin dashboard" not in reply, (path, reply)
    finally:
        server.stop()
        app.stop()


# ---- 4: host spellings and credentials spellings -------------------------------------------------


HOSTED = """  - {name: secret, match: {hosts: [secret.example]}, middlewares: [AUTH], service: s}
  - {name: corp, match: {hosts: ["*.corp.example"]}, middlewares: [AUTH], service: s}
  - {name: open, match: {path_prefix: /}, service: s}"""


@pytest.mark.parametrize("host", ["SECRET.example", "secret.example.", "secret.example:80",
                                  "Secret.Example.:8080", "secret.example:0080",
                                  "x.CORP.example.", "a..corp.example", "a.b.corp.example",
                                  "secret.example:+80", "secret.example:80:80",
                                  "secret.example.:", "secret.example%2e",
                                  "secret%2eexample", "x.corp.example:65535"])
def test_every_spelling_of_a_guarded_host_is_judged_by_its_route(build_dir, tmp_path, recorder,
                                                                 host):
    # Each spelling a virtual host (nginx, Go's mux after stripping the port) serves as the
    # guarded host meets the route's credentials, over HTTP/1.1 (Host and absolute-form) and
    # HTTP/2 (:authority).
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    routes = HOSTED.replace("AUTH", f"{{basic_auth: {{users_file: {users}}}}}")
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}')
    try:
        assert send(server, f"GET /x HTTP/1.1\r\nHost: {host}\r\n\r\n") in (400, 401)
        assert send(server, f"GET http://{host}/x HTTP/1.1\r\nHost: {host}\r\n\r\n") in (400, 401)
        status, _ = h2_exchange(server, request_headers("/x", authority=host))
        assert status in (400, 401, None)
        assert recorder.requests == []
    finally:
        server.stop()


def basic(text):
    return "Basic " + base64.b64encode(text).decode()


@pytest.mark.parametrize("spelling", [
    basic(b"alice:secret") + "=", basic(b"alice:secret") + basic(b"admin:x")[6:],
    "Basic YWxp Y2U6c2VjcmV0", basic(b"alice:secret:x"), basic(b"alice:secret\0admin"),
    "Basic " + base64.b64encode(b"alice:secret").decode() + "!", "Bearer x, " + ALICE,
    basic(b"ALICE:secret"), basic(b"Alice:secret"), basic(b" alice:secret"),
    basic(b"alice :secret"), basic(b"alice:secret "), basic(b"alice\0:secret"),
    basic(b"\xef\xbb\xbfalice:secret")])
def test_credentials_the_upstream_could_read_otherwise_are_refused(build_dir, tmp_path, recorder,
                                                                   spelling):
    # basic_auth verifies one user; the upstream decodes the same field itself (Werkzeug's
    # lenient base64 drops what is not of its alphabet, Go's is strict): a spelling two
    # decoders could read as two users must not pass.
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    routes = (f"  - {{name: all, match: {{path_prefix: /}}, middlewares: [{{basic_auth: "
              f"{{users_file: {users}}}}}], service: s}}")
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}')
    try:
        assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: {spelling}\r\n\r\n") \
            in (400, 401)
        assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: {ALICE}\r\n\r\n") == 200
        assert len(recorder.requests) == 1
    finally:
        server.stop()


# ---- 5: configurations check-config accepts ------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.com/x", "good.com@evil.com", "a?b", "a#b", "evil.com/",
                                  "good.com:80@evil.com", "evil.com\\\\x", "a b", "[::1",
                                  "a:99999", "a:", "a:x", ":80", "a%2fb", "good.com;evil.com"])
def test_a_redirect_host_that_is_not_a_host_is_refused_by_check_config(build_dir, tmp_path,
                                                                       host):
    from proxy_support import middleware_config_error
    err = middleware_config_error(build_dir, tmp_path, f'[{{redirect: {{host: "{host}"}}}}]')
    assert "redirect.host" in err, err


@pytest.mark.parametrize("host", ["example.com", "Example.COM:8443", "127.0.0.1:80", "[::1]:8080",
                                  "[::1]", "a-b.example"])
def test_a_redirect_host_that_is_a_host_loads(build_dir, tmp_path, host):
    config = tmp_path / "good.yaml"
    config.write_text(f"""servers:
  - {{listen: 127.0.0.1:0}}
routes:
  - match: {{path_prefix: /}}
    middlewares: [{{redirect: {{host: "{host}"}}}}]
    service: s
services:
  s: {{url: "http://127.0.0.1:9"}}
""")
    assert checks(build_dir, config)


# ---- 8: route paths and written fields check-config accepts ------------------------------------


def checks(build_dir, path):
    import subprocess
    done = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config", str(path)],
                          capture_output=True, text=True, timeout=30)
    return done.returncode == 0


UNNORMAL = [("path_prefix", "/%7Euser", "/~user/x"), ("path_prefix", "/%7Euser", "/%7Euser/x"),
            ("path_prefix", "/%61dmin", "/admin/x"), ("path_prefix", "//admin", "//admin/x"),
            ("path_prefix", "/a/../admin", "/admin/x"), ("path_prefix", "/admin/./x", "/admin/x/y"),
            ("path_prefix", "/admin?x", "/admin?x"), ("path", "/%7Euser", "/~user"),
            ("path", "/admin//x", "/admin//x")] + [
    # Generated: each letter of /admin escaped (both hex cases), dot segments, doubled slashes.
    (key, "/admin"[:i] + escape.format(ord("/admin"[i])) + "/admin"[i + 1:], "/admin/x")
    for key in ("path_prefix", "path") for i in range(1, 6) for escape in ("%{:02x}", "%{:02X}")
] + [(key, prefix, "/admin/x") for key in ("path_prefix", "path")
     for prefix in ("/./admin", "/x/../admin", "///admin", "/admin/.", "/admin/x/..")]


@pytest.mark.parametrize("key,prefix,path", UNNORMAL)
def test_a_guarded_route_path_is_read_as_requests_are_or_refused(build_dir, tmp_path, recorder,
                                                                 key, prefix, path):
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    text = f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - name: guard
    match: {{{key}: "{prefix}"}}
    middlewares: [{{basic_auth: {{users_file: {users}}}}}]
    service: s
  - {{name: open, match: {{path_prefix: /}}, service: s}}
services:
  s: {{url: "http://127.0.0.1:{recorder.port}"}}
"""
    config = tmp_path / "guard.yaml"
    config.write_text(text)
    if not checks(build_dir, config):
        return  # refused: the operator is told
    server = gateway(build_dir, tmp_path, text)
    try:
        assert send(server, f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n") in (400, 401), \
            recorder.targets()
        assert recorder.requests == []
    finally:
        server.stop()


class FramingAuth(RecordingUpstream):
    """An auth service whose 200 carries the framing and authority fields every answer has."""

    def answer(self, head, body):
        return (b"HTTP/1.1 200 OK\r\nHost: internal.admin\r\nX-User: alice\r\n"
                b"Content-Length: 0\r\n\r\n")


WRITTEN_REFUSED = ["Content-Length", "Transfer-Encoding", "Host", "content-length", "HOST",
                   "TRANSFER-ENCODING", "Connection", "Keep-Alive", "TE", "Upgrade",
                   "Proxy-Connection"]


@pytest.mark.parametrize("middleware", [
    f"{{forward_auth: {{service: auth, response_headers: [X-User, {name}]}}}}"
    for name in WRITTEN_REFUSED] + [
    f"{{jwt: {{jwks_file: KEYS, claims_to_headers: {{sub: X-User, role: {name}}}}}}}"
    for name in WRITTEN_REFUSED])
def test_a_written_field_that_would_be_dropped_is_refused_by_check_config(build_dir, tmp_path,
                                                                         middleware):
    keys = tmp_path / "keys.json"
    keys.write_text('{"keys": [{"kty": "oct", "k": "' + "A" * 43 + '"}]}')
    config = tmp_path / "bad.yaml"
    config.write_text(f"""servers:
  - {{listen: 127.0.0.1:0}}
routes:
  - match: {{path_prefix: /}}
    middlewares: [{middleware.replace("KEYS", str(keys))}]
    service: s
services:
  s: {{url: "http://127.0.0.1:9"}}
  auth: {{url: "http://127.0.0.1:9"}}
""")
    assert not checks(build_dir, config)


def test_framing_fields_from_the_auth_service_never_reach_the_upstream(build_dir, tmp_path,
                                                                       recorder):
    # check-config refuses response_headers naming them (test above); an auth service's
    # Content-Length and Host beside the field it is asked for must still not frame or address
    # the upstream's request: a POST with a body that is a request goes up as one request with
    # that body.
    auth = FramingAuth()
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{forward_auth: {service: "
              "auth, response_headers: [X-User]}}], service: s}")
    services = (f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    try:
        inner = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
        reply = raw(server, b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n"
                            b"Connection: close\r\n\r\n%s" % (len(inner), inner))
        assert status_of(reply) == 200, reply
        assert recorder.targets() == ["POST /x HTTP/1.1"], recorder.targets()
        head = head_text(recorder)
        assert fields_named(head, "host") == ["a"] and recorder.requests[0][1] == inner, head
        assert fields_named(head, "content-length") == [str(len(inner))], head
        assert fields_named(head, "x-user") == ["alice"], head
    finally:
        server.stop()
        auth.stop()


# ---- 13: a rate limit against every way of sending many requests at once ------------------------


@pytest.mark.parametrize("how", ["h2 streams in one write", "pipelined", "connections"])
def test_a_burst_sent_at_once_gets_no_more_than_the_burst(build_dir, tmp_path, recorder, how):
    # burst 3, one an hour: however the 12 requests come (one HTTP/2 write, one pipelined
    # HTTP/1.1 write, 12 connections over both workers), 3 reach the upstream.
    import concurrent.futures
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{rate_limit: "
              "{rate: 1/h, burst: 3}}], service: s}")
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}')
    try:
        if how == "h2 streams in one write":
            s, conn = h2_connect(server)
            for i in range(12):
                conn.send_headers(1 + 2 * i, request_headers(f"/{i}"), end_stream=True)
            s.sendall(conn.data_to_send())
            h2_events_until(s, conn, lambda ev: sum(
                isinstance(e, h2.events.StreamEnded) for e in ev) >= 12)
            s.close()
        elif how == "pipelined":
            raw(server, b"".join(b"GET /%d HTTP/1.1\r\nHost: a\r\n\r\n" % i for i in range(12)),
                wait=2)
        else:
            with concurrent.futures.ThreadPoolExecutor(12) as pool:
                list(pool.map(lambda i: send(server, f"GET /{i} HTTP/1.1\r\nHost: a\r\n\r\n"),
                              range(12)))
        time.sleep(0.2)
        assert len(recorder.requests) == 3, recorder.targets()
    finally:
        server.stop()


# ---- 14: two tokens, one verified ----------------------------------------------------------------


def forged(claims):
    """A token signed by no key of the gateway's (alg none), as an app that trusts the
    gateway to have verified would still decode it."""
    from test_canonical_request import b64url
    import json
    return (b64url(json.dumps({"alg": "none"}).encode()) + "." +
            b64url(json.dumps({"exp": int(time.time()) + 300, **claims}).encode()) + ".")


@pytest.mark.parametrize("verified", ["cookie", "header"])
def test_a_jwt_route_forwards_no_second_token_it_did_not_verify(build_dir, tmp_path, recorder,
                                                                 verified):
    # With `cookie: session`, a request carries alice's good token in one place and a forged
    # admin token in the other. The route verifies one; an app behind it that reads the other
    # (Authorization first, or the session cookie first, decoding without verifying: the
    # gateway did that) takes admin. Either the request is refused, or the token the upstream
    # may read is only the one verified.
    from test_canonical_request import config as canonical_config, hs256, jwt_routes
    good, bad = hs256({"sub": "alice", "role": "reader"}), forged({"sub": "root",
                                                                   "role": "admin"})
    cookie, bearer = (good, bad) if verified == "cookie" else (bad, good)
    server = gateway(build_dir, tmp_path, canonical_config(
        recorder, jwt_routes(tmp_path, ", cookie: session")))
    try:
        status = send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nCookie: session={cookie}\r\n"
                              f"Authorization: Bearer {bearer}\r\n\r\n")
        assert status in (200, 400, 401), status
        for head in upstream_heads_of(recorder):
            assert bad not in head, head
    finally:
        server.stop()


@pytest.mark.parametrize("order", ["jwt first", "forward_auth first"])
@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_a_cookie_jwt_route_sends_no_unverified_authorization_anywhere(
        build_dir, tmp_path, recorder, client, order):
    # The class of the case above: a jwt that reads its cookie verified no Authorization, so
    # none reaches the upstream, the mirror target or the forward_auth service (before the jwt
    # or after it: the service judges the fields the upstream gets), over either protocol, in
    # any scheme or spelling of the scheme.
    from test_canonical_request import hs256, jwt_routes
    jwt = jwt_routes(tmp_path, ", cookie: session").split("      - ", 1)[1].split("\n")[0]
    auth, copies = AuthService(), RecordingUpstream()
    chain = [jwt, "{forward_auth: {service: auth}}", "{mirror: {service: copies}}"]
    if order == "forward_auth first":
        chain[0], chain[1] = chain[1], chain[0]
    routes = (f"  - {{name: all, match: {{path_prefix: /}}, middlewares: [{', '.join(chain)}], "
              f"service: s}}")
    services = (f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}\n'
                f'  copies: {{url: "http://127.0.0.1:{copies.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    good, bad = hs256({"sub": "alice", "role": "reader"}), forged({"sub": "root",
                                                                   "role": "admin"})
    try:
        for credential in (f"Bearer {bad}", f"bearer {bad}", f"Basic {bad}", bad):
            if client == "h2":
                status, _ = h2_exchange(server, request_headers("/x") + [
                    ("cookie", f"session={good}"), ("authorization", credential)])
            else:
                status = send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nCookie: session={good}"
                                      f"\r\nAuthorization: {credential}\r\n\r\n")
            assert status == 200, (credential, status)
        wait_until(lambda: len(copies.requests) == 4)
        for peer in (recorder, auth, copies):
            assert len(peer.requests) == 4, peer
            for head in upstream_heads_of(peer):
                assert bad not in head and "authorization" not in head.lower(), head
        assert all(fields_named(h, "x-role") == ["reader"] for h in upstream_heads_of(recorder))
    finally:
        server.stop()
        auth.stop()
        copies.stop()


# ---- 15: a field a headers edit removes, in another spelling -------------------------------------


@pytest.mark.parametrize("spelling", ["X_Internal_Token", "x_internal_token", "X-INTERNAL-TOKEN",
                                      "X_INTERNAL-TOKEN"])
@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_a_field_a_headers_edit_removes_reaches_no_upstream_in_any_spelling(
        build_dir, tmp_path, recorder, spelling, client):
    # remove: [X-Internal-Token] keeps the client from claiming what the services behind trust
    # (an internal caller's token). WSGI, PHP and CGI read X_Internal_Token as that field.
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{headers: {request: "
              "{remove: [X-Internal-Token]}}}], service: s}")
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}')
    try:
        if client == "h2":
            h2_exchange(server, request_headers("/x") + [(spelling.lower(), "forged")])
        else:
            send(server, f"GET /x HTTP/1.1\r\nHost: a\r\n{spelling}: forged\r\n\r\n")
        for head in upstream_heads_of(recorder):
            assert "forged" not in head, head
    finally:
        server.stop()


FORGED_TRAILERS = [("X-Role", "admin"), ("X_Role", "admin"), ("X-Forwarded-For", "6.6.6.6"),
                   ("Authorization", "Bearer forged"), ("X-Internal-Token", "forged"),
                   ("X-Original-URL", "/admin"), ("Host", "admin.internal")]


@pytest.mark.parametrize("trailer", FORGED_TRAILERS, ids=lambda t: t[0])
@pytest.mark.parametrize("client", ["http/1.1", "h2"])
def test_request_trailers_to_an_h2c_upstream_carry_no_judged_removed_or_owned_field(
        build_dir, tmp_path, client, trailer):
    # gRPC-style uploads: the client's trailers go on to an h2c upstream. A field the route
    # writes (X-Role from the token), removes (X-Internal-Token) or the gateway owns must not
    # come in through them.
    from test_gateway_one_request import jwt_keys
    from test_canonical_request import hs256
    h2up = H2cRecorder()
    keys = jwt_keys(tmp_path)
    token = hs256({"sub": "bob", "role": "user"})
    routes = (f"  - {{name: all, match: {{path_prefix: /}}, middlewares: [{{jwt: {{jwks_file: "
              f"{keys}, claims_to_headers: {{role: X-Role}}}}}}, {{headers: {{request: "
              f"{{remove: [X-Internal-Token]}}}}}}], service: s}}")
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{h2up.port}", protocol: h2c}}')
    name, value = trailer
    try:
        if client == "h2":
            s, conn = h2_connect(server)
            conn.send_headers(1, request_headers("/x", "POST") + [
                ("authorization", f"Bearer {token}"), ("te", "trailers")])
            conn.send_data(1, b"hi")
            conn.send_headers(1, [("x-checksum", "1"), (name.lower(), value)], end_stream=True)
            s.sendall(conn.data_to_send())
            h2_events_until(s, conn, lambda ev: any(
                isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
            s.close()
        else:
            raw(server, (f"POST /x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n"
                         f"TE: trailers\r\nTransfer-Encoding: chunked\r\nConnection: close"
                         f"\r\n\r\n2\r\nhi\r\n0\r\nX-Checksum: 1\r\n{name}: {value}"
                         "\r\n\r\n").encode(),
                wait=2)
        # (Today request trailers do not reach an h2c upstream at all, not even X-Checksum:
        # this guards the day they are passed on.)
        for fields in h2up.trailers + h2up.requests:
            assert (name.lower(), value) not in [(n.lower(), v) for n, v in fields], fields
    finally:
        server.stop()
        h2up.stop()


# ---- 16: what follows an answer a middleware made ------------------------------------------------


ANSWERING = {"basic_auth": "{basic_auth: {users_file: USERS}}",
             "rate_limit": "{rate_limit: {rate: 1/h, burst: 1}}",
             "ip_deny": "{ip_deny: [127.0.0.0/8]}", "max_body": "{max_body: 4}",
             "respond": "{respond: {status: 200, body: hello}}",
             "redirect": "{redirect: {path: /elsewhere}}"}


@pytest.mark.parametrize("framing", ["length", "chunked", "expect"])
@pytest.mark.parametrize("middleware", sorted(ANSWERING))
def test_the_body_of_a_request_a_middleware_answered_is_never_read_as_a_request(
        build_dir, tmp_path, recorder, middleware, framing):
    # A POST answered before it went up (401, 429, 403, 413, a fixed answer, a redirect) has a
    # body that is a request; a HEAD answered so has no body to give the next answer. Neither
    # may desynchronise the connection: the smuggled request never reaches the upstream.
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    mw = ANSWERING[middleware].replace("USERS", str(users))
    routes = (f"  - {{name: guarded, match: {{path_prefix: /guarded}}, middlewares: [{mw}], "
              f"service: s}}\n  - {{name: open, match: {{path_prefix: /}}, service: s}}")
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}')
    inner = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
    if framing == "chunked":
        body = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(inner), inner)
    else:
        expect = b"Expect: 100-continue\r\n" if framing == "expect" else b""
        body = b"Content-Length: %d\r\n%s\r\n%s" % (len(inner), expect, inner)
    try:
        for _ in range(2):  # (the second for rate_limit's refusal)
            reply = raw(server, b"HEAD /guarded HTTP/1.1\r\nHost: a\r\n\r\n"
                                b"POST /guarded HTTP/1.1\r\nHost: a\r\n" + body +
                                b"GET /after HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                        wait=2)
            assert reply.startswith(b"HTTP/1.1 "), reply
        assert all("/smuggled" not in line for line in recorder.targets()), recorder.targets()
    finally:
        server.stop()


def test_head_answers_the_gateway_makes_carry_no_body(build_dir, tmp_path, recorder):
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    routes = "\n".join(
        f"  - {{name: {name}, match: {{path: /{name}}}, middlewares: "
        f"[{mw.replace('USERS', str(users))}], service: s}}" for name, mw in ANSWERING.items())
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}')
    try:
        for name in list(ANSWERING) + ["rate_limit"]:
            reply = raw(server, f"HEAD /{name} HTTP/1.1\r\nHost: a\r\n\r\nGET /nowhere HTTP/1.1"
                                f"\r\nHost: a\r\nConnection: close\r\n\r\n".encode(), wait=2)
            first, _, rest = reply.partition(b"\r\n\r\n")
            assert first.startswith(b"HTTP/1.1 ") and rest.startswith(b"HTTP/1.1 "), (name, reply)
    finally:
        server.stop()


@pytest.mark.parametrize("order", ["mirror first", "mirror last"])
@pytest.mark.parametrize("refuser", ["basic_auth", "forward_auth"])
def test_a_request_refused_on_its_way_in_is_never_mirrored(build_dir, tmp_path, recorder, order,
                                                           refuser):
    # A mirror target is a service behind the gateway too: a request the route refused must
    # not reach it, whichever place the mirror has in the list.
    mirror, auth = RecordingUpstream(), AuthService()
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    check = (f"{{basic_auth: {{users_file: {users}}}}}" if refuser == "basic_auth" else
             "{forward_auth: {service: auth}}")
    chain = ["{mirror: {service: copies}}", check]
    if order == "mirror last":
        chain.reverse()
    routes = (f"  - {{name: all, match: {{path_prefix: /}}, middlewares: [{', '.join(chain)}], "
              f"service: s}}")
    services = (f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}\n'
                f'  copies: {{url: "http://127.0.0.1:{mirror.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    server = gateway_for(build_dir, tmp_path, routes, services)
    try:
        assert send(server, "GET /deny/x HTTP/1.1\r\nHost: a\r\n\r\n") == 401
        status, _ = h2_exchange(server, request_headers("/deny/y"))
        assert status == 401
        time.sleep(0.3)
        assert mirror.requests == [] and recorder.requests == [], mirror.targets()
    finally:
        server.stop()
        mirror.stop()
        auth.stop()


@pytest.mark.parametrize("spelling", ["Bearer GOOD BAD", "Bearer GOOD,BAD", "Bearer BAD GOOD",
                                      "Bearer GOOD, Bearer BAD", "Bearer GOOD=", "Bearer GOOD.",
                                      "Basic x, Bearer GOOD", "Bearer\tGOOD"])
def test_a_bearer_field_an_app_could_split_otherwise_is_refused(build_dir, tmp_path, recorder,
                                                                spelling):
    # The route verifies one token of the Authorization field; an app that splits the field
    # itself (on spaces or commas, first or last part) must find no other.
    from test_canonical_request import config as canonical_config, hs256, jwt_routes
    good, bad = hs256({"sub": "alice", "role": "reader"}), forged({"sub": "root",
                                                                   "role": "admin"})
    server = gateway(build_dir, tmp_path, canonical_config(recorder, jwt_routes(tmp_path)))
    try:
        field = spelling.replace("GOOD", good).replace("BAD", bad)
        assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: {field}\r\n\r\n") \
            in (400, 401)
        assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: bearer {good}\r\n"
                            "\r\n") == 200
        assert len(recorder.requests) == 1
    finally:
        server.stop()


def test_an_http10_chunked_body_is_refused_not_forwarded(build_dir, tmp_path, recorder):
    # RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 request is faulty framing (a 1.0 hop
    # in front may have read its body otherwise): its body's request never goes up.
    routes = "  - {name: all, match: {path_prefix: /}, service: s}"
    server = gateway_for(build_dir, tmp_path, routes,
                         f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}')
    try:
        reply = raw(server, b"POST /a HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n22\r\nGET /smuggled HTTP/1.1\r\n"
                            b"Host: a\r\n\r\n\r\n0\r\n\r\n", wait=1.5)
        assert status_of(reply) == 400, reply
        assert recorder.requests == []
    finally:
        server.stop()


# ---- 10: the request that upgrades the connection to h2c (RFC 7540 §3.2) ---------------------


H2C_UPGRADE = ("Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
               "HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n")
GUARDED_BY_UPGRADE = {
    "no credentials": "GET /admin/x HTTP/1.1\r\nHost: a\r\n\r\n",
    "another case": "GET /ADMIN/x HTTP/1.1\r\nHost: a\r\n\r\n",
    "dot segments": "GET /public/../admin/x HTTP/1.1\r\nHost: a\r\n\r\n",
    "a guarded host": "GET /x HTTP/1.1\r\nHost: ADMIN.internal.\r\n\r\n",
    "X_Forwarded_For": "GET /x HTTP/1.1\r\nHost: a\r\nX_Forwarded_For: 10.0.0.1\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(GUARDED_BY_UPGRADE) + ["refused: " + c for c in [
    "obs-fold on Authorization", "two Hosts in two cases", "a fragment", "%2f",
    "an absolute-form target and another Host", "a lower-case unknown method",
    "Content_Length", "a Host with a comma"]])
def test_the_request_that_upgrades_to_h2c_is_judged_as_any_other(build_dir, tmp_path, recorder,
                                                                 case):
    # The gateway takes `Upgrade: h2c` itself: the upgrading request is answered as stream 1.
    # It must meet the same canonical request, routes and credentials as any HTTP/1.1 one.
    from test_canonical_attacks import REFUSED_H1, guarded_routes
    from test_canonical_request import config as canonical_config
    text = REFUSED_H1[case[9:]] if case.startswith("refused: ") else GUARDED_BY_UPGRADE[case]
    server = gateway(build_dir, tmp_path, canonical_config(recorder, guarded_routes(tmp_path)))
    try:
        head, _, body = text.partition("\r\n\r\n")
        reply = raw(server, (head + "\r\n" + H2C_UPGRADE + "\r\n" + body).encode("latin-1"),
                    wait=1.5)
        assert reply, case
        assert recorder.requests == [], (case, reply[:200], upstream_heads_of(recorder))
    finally:
        server.stop()


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_of_the_h2c_upgrading_request_is_never_read_as_http2_frames(build_dir, tmp_path,
                                                                            recorder, framing):
    # Attack: the upgrading POST's body is an HTTP/2 preface and a stream to /admin/x. Read as
    # the body it is, it reaches the upstream as data of POST /public; read as frames after
    # the 101, it is a request no route judged.
    import h2.config
    import h2.connection
    from test_canonical_attacks import guarded_routes
    from test_canonical_request import config as canonical_config
    inner = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    inner.initiate_connection()
    inner.send_headers(1, request_headers("/admin/x"), end_stream=True)
    frames = inner.data_to_send()
    if framing == "length":
        body = b"Content-Length: %d\r\n\r\n%s" % (len(frames), frames)
    else:
        body = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(frames), frames)
    server = gateway(build_dir, tmp_path, canonical_config(recorder, guarded_routes(tmp_path)))
    try:
        raw(server, b"POST /public HTTP/1.1\r\nHost: a\r\n" + H2C_UPGRADE.encode() + body,
            wait=1.5)
        assert all(not line.split(" ")[1].lower().startswith("/admin")
                   for line in recorder.targets()), recorder.targets()
    finally:
        server.stop()


# ---- 11: a reload while a request is between its judgement and its forwarding ----------------


class SlowAuth(AuthService):
    """An auth service that takes its time: a reload lands while the question is out."""

    def answer(self, head, body):
        time.sleep(0.8)
        return b"HTTP/1.1 200 OK\r\nX-User: alice\r\nX-Tier: gold\r\nContent-Length: 0\r\n\r\n"


class SlowUpstream(RecordingUpstream):
    def answer(self, head, body):
        time.sleep(0.8)
        return (b"HTTP/1.1 200 OK\r\nX-Powered-By: php\r\nX-Frame-Options: ALLOW\r\n"
                b"Content-Length: 2\r\n\r\nok")


def versioned_config(upstream, auth, version):
    """Version 1 and 2 differ in every edit the route makes, each way."""
    written = "X-User" if version == 1 else "X-Tier"
    return f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - name: all
    match: {{path_prefix: /}}
    middlewares:
      - {{headers: {{request: {{set: {{X-Version: "{version}"}}}},
                    response: {{remove: [X-Powered-By], set: {{X-Frame-Options: V{version}}}}}}}}}
      - {{forward_auth: {{service: auth, response_headers: [{written}]}}}}
      - {{strip_prefix: /v{version}}}
    service: s
services:
  s: {{url: "http://127.0.0.1:{upstream.port}"}}
  auth: {{url: "http://127.0.0.1:{auth.port}"}}
"""


@pytest.mark.parametrize("slow", ["auth", "upstream"])
def test_a_request_in_flight_at_a_reload_is_forwarded_as_one_version_judged_it(build_dir,
                                                                               tmp_path, slow):
    # Invariant: a request is judged and edited by one configuration, whichever: never the
    # auth fields of one version with the header edits or path rewrite of the other. Under
    # ASan this also catches a route freed under the request by the reload.
    import threading
    from test_reload import Gateway
    upstream = SlowUpstream() if slow == "upstream" else RecordingUpstream()
    auth = SlowAuth() if slow == "auth" else AuthService()
    gw = Gateway(build_dir, tmp_path, versioned_config(upstream, auth, 1))
    replies = []
    try:
        sender = threading.Thread(target=lambda: replies.append(raw(
            gw.server, b"GET /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", wait=5)))
        sender.start()
        assert wait_until(lambda: (auth if slow == "auth" else upstream).requests, 3)
        gw.sighup(versioned_config(upstream, auth, 2))
        sender.join()
        status, fields = h1_fields(replies[0])
        assert status == 200, replies
        head = head_text(upstream)
        version = fields_named(head, "x-version")
        assert version in (["1"], ["2"]), head
        if version == ["1"]:
            assert head.startswith("GET /x ") and fields_named(head, "x-user") == ["alice"], head
            assert fields_named(head, "x-tier") == [], head
        else:
            assert head.startswith("GET /v1/x ") and fields_named(head, "x-tier") == ["gold"]
        assert dict((n.lower(), v) for n, v in fields).get("x-frame-options", "V1")[0] == "V"
        assert not any(n.lower() == "x-powered-by" for n, _ in fields), fields
    finally:
        gw.stop()
        upstream.stop()
        auth.stop()


# ---- 12: TLS with ALPN: the scheme is the connection's -------------------------------------------


@pytest.mark.parametrize("alpn", ["h2", "http/1.1"])
def test_over_tls_the_scheme_is_https_whatever_the_client_claims(build_dir, tmp_path, certs,
                                                                 recorder, alpn):
    # An HTTP/2 client over TLS says :scheme http (or an HTTP/1.1 one an http:// absolute
    # form): the upstream and the auth service are told https, as the client connected.
    import ssl
    auth = AuthService()
    routes = ("  - {name: all, match: {path_prefix: /}, middlewares: [{forward_auth: "
              "{service: auth}}], service: s}")
    services = (f'  s: {{url: "http://127.0.0.1:{recorder.port}"}}\n'
                f'  auth: {{url: "http://127.0.0.1:{auth.port}"}}')
    tls = f", tls: {{cert: {certs}/localhost.pem, key: {certs}/localhost.key}}"
    server = gateway_for(build_dir, tmp_path, routes, services, server_extra=tls)
    try:
        ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
        ctx.set_alpn_protocols([alpn])
        sock = ctx.wrap_socket(socket.create_connection((server.host, server.port), timeout=5),
                               server_hostname="localhost")
        assert sock.selected_alpn_protocol() == alpn
        if alpn == "h2":
            import h2.config
            import h2.connection
            conn = h2.connection.H2Connection(config=h2.config.H2Configuration(
                client_side=True, validate_outbound_headers=False))
            conn.initiate_connection()
            conn.send_headers(1, [(":method", "GET"), (":path", "/x"), (":scheme", "http"),
                                  (":authority", "localhost")], end_stream=True)
            sock.sendall(conn.data_to_send())
            h2_events_until(sock, conn, lambda ev: any(
                isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
        else:
            sock.sendall(b"GET http://localhost/x HTTP/1.1\r\nHost: localhost\r\n"
                         b"Connection: close\r\n\r\n")
            sock.settimeout(3)
            try:
                while sock.recv(65536):
                    pass
            except OSError:
                pass
        sock.close()
        assert len(recorder.requests) == 1 and len(auth.requests) == 1
        for peer in (recorder, auth):
            for head, _ in peer.requests:
                assert fields_named(head.decode("latin-1"), "x-forwarded-proto") == ["https"], head
    finally:
        server.stop()
        auth.stop()


@pytest.mark.parametrize("what", ["basic_auth user removed", "jwt key rotated"])
def test_credentials_good_before_a_reload_that_revokes_them_are_refused_after(
        build_dir, tmp_path, recorder, what):
    # basic_auth remembers credentials it found good (a digest of user, password and hash);
    # a key rotated out of the JWKS must take its tokens with it. Same connection, too.
    import json
    from test_canonical_request import JWT_SECRET, b64url, hs256
    from test_reload import Gateway
    users, keys = tmp_path / "users", tmp_path / "keys.json"
    users.write_text(HTPASSWD)
    keys.write_text(json.dumps({"keys": [{"kty": "oct", "kid": "k", "k": b64url(JWT_SECRET)}]}))
    check = (f"{{basic_auth: {{users_file: {users}}}}}" if what.startswith("basic") else
             f"{{jwt: {{jwks_file: {keys}}}}}")
    credential = ALICE if what.startswith("basic") else f"Bearer {hs256({'sub': 'alice'})}"
    text = f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: all, match: {{path_prefix: /}}, middlewares: [{check}], service: s}}
services:
  s: {{url: "http://127.0.0.1:{recorder.port}"}}
"""
    gw = Gateway(build_dir, tmp_path, text)
    request = f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: {credential}\r\n\r\n".encode()
    s = socket.create_connection((gw.server.host, gw.server.port), timeout=5)
    try:
        s.sendall(request)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        if what.startswith("basic"):
            users.write_text("bob:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=\n")
        else:
            keys.write_text(json.dumps({"keys": [{"kty": "oct", "kid": "k2",
                                                  "k": b64url(b"z" * 32)}]}))
        gw.sighup(text + "# revoked\n")
        s.sendall(request)
        assert status_of(s.recv(65536)) in (401, None)
        assert send(gw.server, request.decode()) == 401
        assert len(recorder.requests) == 1
    finally:
        s.close()
        gw.stop()
