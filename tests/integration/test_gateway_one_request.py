"""One request, judged and forwarded (issue 67): the auth service of forward_auth, the mirror
target, the upstream (after a retry too) and the route all get the request the route judged,
whatever the order of the route's middlewares and whatever the client's protocol; every case
spelling of a protected path, and HEAD for GET, is judged by the route that protects it; a
headers middleware's Host edit takes effect (or check-config refuses it), and response edits
apply to every head the client gets: interim responses and trailers too."""
import itertools
import json

import h2.events
import pytest

from proxy_support import (RecordingUpstream, gateway, h2_connect, h2_events_until,
                           held_dead_port, middleware_config_error, raw, request_headers, upstream,
                           wait_until)
from test_canonical_request import ALICE, HTPASSWD, b64url, fields_named, hs256, send

JWT_SECRET_KEYS = "keys.json"


class AuthService(RecordingUpstream):
    """A forward_auth service: lets every request through, naming its user in X-User."""

    def answer(self, head, body):
        return b"HTTP/1.1 200 OK\r\nX-User: alice\r\nContent-Length: 0\r\n\r\n"


def jwt_keys(tmp_path):
    from test_canonical_request import JWT_SECRET
    path = tmp_path / JWT_SECRET_KEYS
    path.write_text(json.dumps({"keys": [{"kty": "oct", "kid": "k", "k": b64url(JWT_SECRET)}]}))
    return path


# The middlewares whose order is generated: each writes or judges the fields the client also
# sends (X-Tenant, X-Role, X-User).
def middleware_texts(tmp_path, auth_port):
    return {
        "headers": "{headers: {request: {set: {X-Tenant: public}}}}",
        "jwt": f"{{jwt: {{jwks_file: {jwt_keys(tmp_path)}, claims_to_headers: {{role: X-Role}}}}}}",
        "forward_auth": "{forward_auth: {service: auth, path: /verify, "
                        "response_headers: [X-User]}}",
        "mirror": "{mirror: {service: copies}}",
    }


WRITTEN = ("x-tenant", "x-role", "x-user")
CLIENT_FIELDS = [("X-Tenant", "admin"), ("X-Role", "admin"), ("X-User", "root")]


def h2_request(server, headers):
    """One HTTP/2 request: its status."""
    s, conn = h2_connect(server)
    conn.send_headers(1, headers, end_stream=True)
    s.sendall(conn.data_to_send())
    events = h2_events_until(s, conn, lambda ev: any(
        isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
    s.close()
    return next((int(dict(e.headers)[b":status"]) for e in events
                 if isinstance(e, h2.events.ResponseReceived)), None)


@pytest.mark.parametrize("order", list(itertools.permutations(["headers", "jwt",
                                                               "forward_auth"])))
def test_the_auth_service_the_mirror_and_the_upstream_read_the_fields_alike(build_dir, tmp_path,
                                                                            order):
    # Invariant: a field the auth service is sent has the value the upstream gets, or the
    # upstream gets none of that name (never the client's value to one, another to the other);
    # the mirror target and the upstream get the same fields. Every order of three middlewares
    # that write fields the client also sends, both protocols, and a retry (the pool's first
    # target refuses connections).
    upstream, auth, copies = RecordingUpstream(), AuthService(), RecordingUpstream()
    dead = held_dead_port()
    texts = middleware_texts(tmp_path, auth.port)
    chain = ", ".join([texts[name] for name in order] + [texts["mirror"]])
    server = gateway(build_dir, tmp_path, f"""
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: off
routes:
  - name: all
    match: {{path_prefix: /}}
    middlewares: [{chain}]
    service: s
services:
  s: {{upstream: pool, retries: {{attempts: 2, budget: 100%}}}}
  auth: {{url: "http://127.0.0.1:{auth.port}"}}
  copies: {{url: "http://127.0.0.1:{copies.port}"}}
upstreams:
  pool:
    targets: [{{address: "127.0.0.1:{dead[1]}"}}, {{address: "127.0.0.1:{upstream.port}"}}]
    health: {{passive: {{max_fails: 0}}}}
""")
    token = hs256({"sub": "bob", "role": "user"})
    try:
        sent = 0
        for protocol, round_ in itertools.product(("http/1.1", "h2"), range(2)):
            if protocol == "h2":
                got = h2_request(server, request_headers("/x") + [
                    ("authorization", f"Bearer {token}")] +
                    [(n.lower(), v) for n, v in CLIENT_FIELDS])
            else:
                got = send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}"
                                   "\r\n" + "".join(f"{n}: {v}\r\n" for n, v in CLIENT_FIELDS)
                           + "\r\n")
            assert got == 200, (protocol, got)
            sent += 1
            assert wait_until(lambda: len(copies.requests) >= sent and len(auth.requests) >= sent)
            up = upstream.requests[-1][0].decode("latin-1")
            judged = auth.requests[-1][0].decode("latin-1")
            copy = copies.requests[-1][0].decode("latin-1")
            assert fields_named(up, "x-tenant") == ["public"], up
            assert fields_named(up, "x-role") == ["user"], up
            assert fields_named(up, "x-user") == ["alice"], up
            for name in WRITTEN:
                asked = fields_named(judged, name)
                assert asked in ([], fields_named(up, name)), (protocol, order, name, judged)
                assert fields_named(copy, name) == fields_named(up, name), (name, copy)
        assert len(upstream.requests) == sent
    finally:
        server.stop()
        for peer in (upstream, auth, copies):
            peer.stop()
        dead[0].close()


def test_the_auth_service_gets_what_the_middlewares_before_it_wrote(build_dir, tmp_path):
    # The fields a headers middleware and jwt wrote before forward_auth are what the service is
    # asked about: the service can judge the tenant and role the upstream will act on.
    upstream, auth = RecordingUpstream(), AuthService()
    texts = middleware_texts(tmp_path, auth.port)
    server = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, access_log: off}}
routes:
  - name: all
    match: {{path_prefix: /}}
    middlewares: [{texts['headers']}, {texts['jwt']}, {texts['forward_auth']}]
    service: s
services:
  s: {{url: "http://127.0.0.1:{upstream.port}"}}
  auth: {{url: "http://127.0.0.1:{auth.port}"}}
""")
    token = hs256({"sub": "bob", "role": "user"})
    try:
        assert send(server, f"GET /x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\n"
                            "X-Tenant: admin\r\nX-Role: admin\r\nX-User: root\r\n\r\n") == 200
        judged = auth.requests[-1][0].decode("latin-1")
        assert fields_named(judged, "x-tenant") == ["public"], judged
        assert fields_named(judged, "x-role") == ["user"], judged
        assert fields_named(judged, "x-user") == [], judged
    finally:
        server.stop()
        upstream.stop()
        auth.stop()


# ---- HEAD and the case of a path --------------------------------------------------------------


def spellings(word):
    """Every ASCII case spelling of `word`."""
    return ["".join(letters) for letters in itertools.product(*[(c.lower(), c.upper())
                                                                 for c in word])]


def test_every_case_spelling_and_head_are_judged_by_the_protecting_route(build_dir, tmp_path):
    upstream = RecordingUpstream()
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    auth = f"[{{basic_auth: {{users_file: {users}}}}}]"
    server = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: admin, match: {{path_prefix: /admin}}, middlewares: {auth}, service: s}}
  - {{name: exact, match: {{path: /keys}}, middlewares: {auth}, service: s}}
  - {{name: regex, match: {{path_regex: "^/ops/"}}, middlewares: {auth}, service: s}}
  - name: reports
    match: {{path_prefix: /reports, methods: [GET]}}
    middlewares: {auth}
    service: s
  - {{name: public, match: {{}}, service: s}}
services:
  s: {{url: "http://127.0.0.1:{upstream.port}"}}
""")
    try:
        paths = ([f"/{w}/users" for w in spellings("admin")] +
                 [f"/{w}" for w in spellings("keys")] + [f"/{w}/" for w in spellings("keys")] +
                 [f"/{w}/x" for w in spellings("ops")])
        for path in paths:
            assert send(server, f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n") == 401, path
        for path in paths[::7]:
            assert h2_request(server, request_headers(path)) == 401, path
        for method in ("HEAD", "head", "GET"):
            assert send(server, f"{method} /reports HTTP/1.1\r\nHost: a\r\n\r\n") == 401, method
            assert h2_request(server, request_headers("/reports", method.upper())) == 401
        assert upstream.requests == []
        # With credentials, HEAD goes on to the upstream as HEAD; POST is not the route's.
        assert send(server, f"HEAD /REPORTS HTTP/1.1\r\nHost: a\r\nAuthorization: {ALICE}"
                            "\r\n\r\n") == 200
        assert upstream.targets()[-1] == "HEAD /REPORTS HTTP/1.1"
        assert send(server, "POST /reports HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n") \
            == 200
        # Paths that only look alike are not the route's.
        for path in ("/keysx", "/keys/x", "/opsx/", "/xadmin"):
            assert send(server, f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n") == 200, path
    finally:
        server.stop()
        upstream.stop()


def test_strip_prefix_strips_every_case_spelling_its_route_takes(build_dir, tmp_path):
    upstream = RecordingUpstream()
    server = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, access_log: off}}
routes:
  - {{name: api, match: {{path_prefix: /api/}}, middlewares: [{{strip_prefix: /api}}], service: s}}
services:
  s: {{url: "http://127.0.0.1:{upstream.port}"}}
""")
    try:
        for word in spellings("api"):
            assert send(server, f"GET /{word}/users?x HTTP/1.1\r\nHost: a\r\n\r\n") == 200
            assert upstream.targets()[-1] == "GET /users?x HTTP/1.1", word
    finally:
        server.stop()
        upstream.stop()


# ---- 8: a Host edit ---------------------------------------------------------------------------


def test_a_host_set_by_a_headers_middleware_is_the_host_the_upstream_and_mirror_see(
        build_dir, tmp_path):
    upstream, copies = RecordingUpstream(), RecordingUpstream()
    server = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - name: all
    match: {{path_prefix: /}}
    middlewares:
      - headers: {{request: {{set: {{Host: "internal.example:8443"}}}}}}
      - mirror: {{service: copies}}
    service: s
services:
  s: {{url: "http://127.0.0.1:{upstream.port}"}}
  copies: {{url: "http://127.0.0.1:{copies.port}"}}
""")
    try:
        assert send(server, "GET /x HTTP/1.1\r\nHost: public.example\r\n\r\n") == 200
        assert h2_request(server, request_headers("/y", authority="public.example")) == 200
        assert wait_until(lambda: len(copies.requests) == 2)
        for peer in (upstream, copies):
            for head, _ in peer.requests:
                head = head.decode("latin-1")
                assert fields_named(head, "host") == ["internal.example:8443"], head
                assert fields_named(head, "x-forwarded-host") == ["public.example"], head
    finally:
        server.stop()
        upstream.stop()
        copies.stop()


@pytest.mark.parametrize("middlewares, where", [
    ("[{headers: {request: {add: {host: a.example}}}}]", "headers.request.add.host: a request has "
                                                         "one Host"),
    ("[{headers: {request: {remove: [Host]}}}]", "headers.request.remove: a request has one Host"),
    ("[{headers: {request: {set: {host: 'a.example/x'}}}}]",
     "headers.request.set.host: 'a.example/x' is not host[:port]"),
    ("[{headers: {request: {set: {host: 'good.com:443@evil.com'}}}}]",
     "headers.request.set.host: 'good.com:443@evil.com' is not host[:port]"),
    ("[{headers: {request: {set: {Content-Length: '5'}}}}]",
     "headers.request.set.Content-Length: 'Content-Length' is written by the sender"),
    ("[{headers: {request: {remove: [transfer-encoding]}}}]",
     "headers.request.remove: 'transfer-encoding' is written by the sender"),
    ("[{headers: {request: {add: {Authorization: 'Basic eDp5'}}}}]",
     "headers.request.add.Authorization: a request has one Authorization: set it"),
    ("[{headers: {response: {set: {Connection: close}}}}]",
     "headers.response.set.Connection: 'Connection' is written by the sender"),
    ("[{headers: {response: {add: {keep-alive: 'timeout=5'}}}}]",
     "headers.response.add.keep-alive: 'keep-alive' is written by the sender"),
])
def test_an_edit_that_would_be_dropped_is_refused_by_check_config(build_dir, tmp_path,
                                                                  middlewares, where):
    err = middleware_config_error(build_dir, tmp_path, middlewares)
    assert f"bad.yaml:5: routes[0].middlewares[0].{where}" in err, err


# ---- 9: response edits on interim responses and trailers ---------------------------------------


class HintingUpstream(RecordingUpstream):
    """An HTTP/1.1 upstream that answers with a 103, then a 200, each with fields to edit."""

    def answer(self, head, body):
        return (b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n"
                b"X-Powered-By: php\r\nX-Frame-Options: ALLOW\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Powered-By: php\r\n\r\nok")


EDITS = ("{headers: {response: {remove: [X-Powered-By], set: {X-Frame-Options: DENY}, "
         "add: {X-Edited: yes}}}}")


def hinting_gateway(build_dir, tmp_path, port, protocol):
    return gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
  - {{name: all, match: {{path_prefix: /}}, middlewares: [{EDITS}], service: s}}
services:
  s: {{url: "http://127.0.0.1:{port}", protocol: {protocol}}}
""")


def assert_edited(fields, where):
    """No field a response edit removed; the one it set, if any, only as set."""
    lowered = [(n.lower(), v) for n, v in fields]
    assert not any(n == "x-powered-by" for n, _ in lowered), (where, fields)
    assert all(v == "DENY" for n, v in lowered if n == "x-frame-options"), (where, fields)


def h1_heads(text):
    """The interim heads, the final head and the trailers of an HTTP/1.1 answer, as lists of
    (name, value)."""
    parts, trailers = [], []
    while True:
        head, _, text = text.partition("\r\n\r\n")
        lines = head.split("\r\n")
        parts.append((int(lines[0].split(" ")[1]), [tuple(l.split(": ", 1)) for l in lines[1:]]))
        if parts[-1][0] >= 200:
            break
    if "\r\n0\r\n" in "\r\n" + text:
        tail = ("\r\n" + text).split("\r\n0\r\n", 1)[1]
        trailers = [tuple(l.split(": ", 1)) for l in tail.split("\r\n") if l]
    return parts, trailers


def h2_heads(server, path):
    s, conn = h2_connect(server)
    conn.send_headers(1, request_headers(path) + [("te", "trailers")], end_stream=True)
    s.sendall(conn.data_to_send())
    events = h2_events_until(s, conn, lambda ev: any(
        isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
    s.close()
    parts, trailers = [], []
    for e in events:
        fields = [(n.decode(), v.decode()) for n, v in e.headers if not n.startswith(b":")] \
            if hasattr(e, "headers") and e.headers else []
        if isinstance(e, (h2.events.InformationalResponseReceived, h2.events.ResponseReceived)):
            parts.append((int(dict(e.headers)[b":status"]), fields))
        elif isinstance(e, h2.events.TrailersReceived):
            trailers = fields
    return parts, trailers


@pytest.mark.parametrize("client", ["http/1.1", "h2"])
@pytest.mark.parametrize("protocol", ["http", "h2c"])
def test_response_edits_apply_to_every_head_and_the_trailers(build_dir, tmp_path, client,
                                                             protocol):
    # Invariant: every head the client gets (interim ones, the final one) carries the route's
    # response edits, and the trailers carry no field an edit removed or set. Both client
    # protocols, an HTTP/1.1 upstream (its trailers are not passed on) and an h2c one.
    if protocol == "http":
        peer, path = HintingUpstream(), "/x"
    else:
        peer, path = upstream(build_dir, "u"), "/hints-and-trailers"
    server = hinting_gateway(build_dir, tmp_path, peer.port, protocol)
    try:
        if client == "h2":
            parts, trailers = h2_heads(server, path)
        else:
            parts, trailers = h1_heads(raw(server, f"GET {path} HTTP/1.1\r\nHost: a\r\n"
                                                   "TE: trailers\r\nConnection: close\r\n\r\n"
                                                   .encode()).decode("latin-1"))
        assert [status for status, _ in parts] == [103, 200], parts
        for status, fields in parts:
            assert_edited(fields, status)
            lowered = [(n.lower(), v) for n, v in fields]
            assert ("x-frame-options", "DENY") in lowered and ("x-edited", "yes") in lowered, \
                (status, fields)
        assert ("link", "</a.css>; rel=preload") in [(n.lower(), v) for n, v in parts[0][1]]
        if protocol == "h2c":
            assert_edited(trailers, "trailers")
            lowered = [(n.lower(), v) for n, v in trailers]
            assert not any(n == "x-frame-options" for n, _ in lowered), trailers
            assert ("x-checksum", "1") in lowered, trailers
    finally:
        server.stop()
        peer.stop()


# ---- the chain and its phases -----------------------------------------------------------------


def test_check_config_prints_each_routes_chain_in_order_with_its_phases(build_dir, tmp_path):
    import os
    import subprocess
    users = tmp_path / "users"
    users.write_text(HTPASSWD)
    config = tmp_path / "chain.yaml"
    config.write_text(f"""
servers:
  - {{listen: 127.0.0.1:0}}
routes:
  - name: api
    match: {{path_prefix: /api/}}
    middlewares:
      - rate_limit: {{rate: 10/s, burst: 5}}
      - headers: {{request: {{set: {{X-Tenant: a}}}}, response: {{remove: [Server]}}}}
      - basic_auth: {{users_file: {users}}}
      - strip_prefix: /api
      - mirror: {{service: s}}
      - compression: {{}}
    service: s
  - {{name: plain, match: {{path_prefix: /}}, service: s}}
services:
  s: {{url: "http://127.0.0.1:9"}}
""")
    done = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config",
                           str(config)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1:] == ["route api: 1 rate_limit [answer, response], 2 headers [request, "
                         "response], 3 basic_auth [answer], 4 strip_prefix [request], 5 mirror "
                         "[forward], 6 compression [response]"], done.stdout


# ---- What basic_auth, jwt and a rate limit's header: key judge -------------------------------

# A headers middleware's request edits, each of a field basic_auth, jwt or rate_limit judges.
JUDGED_EDITS = {
    "set-basic": ("authorization", ALICE),
    "set-bearer": ("authorization", "BEARER"),  # the test's token, made when it runs
    "remove-authorization": ("authorization", None),
    "set-key": ("x-key", "shared"),
    "remove-key": ("x-key", None),
}
JUDGES = ("basic_auth", "jwt", "rate_limit")


def judged_chains():
    """Every order of one headers middleware and a non-empty set of the judges, with each of
    JUDGED_EDITS: (order, edit)."""
    for size in range(1, len(JUDGES) + 1):
        for judges in itertools.combinations(JUDGES, size):
            for order in itertools.permutations(("headers",) + judges):
                for edit in JUDGED_EDITS:
                    yield order, edit


def judged_texts(tmp_path, edit, bearer):
    """The YAML of each middleware of judged_chains, `edit` for the headers one."""
    name, value = JUDGED_EDITS[edit]
    value = bearer if value == "BEARER" else value
    change = f'set: {{{name}: "{value}"}}' if value is not None else f"remove: [{name}]"
    (tmp_path / "users").write_text(HTPASSWD)
    return {
        "headers": f"{{headers: {{request: {{{change}}}}}}}",
        "basic_auth": f"{{basic_auth: {{users_file: {tmp_path / 'users'}}}}}",
        "jwt": f"{{jwt: {{jwks_file: {jwt_keys(tmp_path)}}}}}",
        "rate_limit": '{rate_limit: {key: "header:X-Key", rate: 1/h, burst: 1}}',
    }


def judged_outcome(order, edit, bearer, fields, seen_keys):
    """What the chain `order` makes of a request with `fields` ({name: value or None}): 401 or
    429 where a judge refuses what the middlewares before it left, else 200 and the fields
    the upstream must get. `seen_keys`: the rate limit's keys so far (1 a key)."""
    fields = dict(fields)
    for m in order:
        if m == "headers":
            name, value = JUDGED_EDITS[edit]
            fields[name] = bearer if value == "BEARER" else value
        elif m == "basic_auth" and fields["authorization"] != ALICE:
            return 401, None
        elif m == "jwt" and fields["authorization"] != bearer:
            return 401, None
        elif m == "rate_limit":
            key = fields["x-key"] or ""
            if key in seen_keys:
                return 429, None
            seen_keys.add(key)
    return 200, fields


@pytest.mark.parametrize("protocol", ["http/1.1", "h2"])
def test_basic_auth_jwt_and_rate_limit_judge_what_the_upstream_gets(build_dir, tmp_path,
                                                                   protocol):
    # Invariant: what basic_auth, jwt and a rate limit's header: key judge is what the upstream
    # gets. A headers edit before them (of Authorization, of the key's field) changes what they
    # judge; one after them does not. Every order of a headers edit and the judges, each edit,
    # three clients' Authorization (basic, bearer, none) with a key of their own; both
    # protocols. Either spindle answers 401/429 where the model says, or 200 and the upstream
    # got exactly the Authorization and X-Key that were judged.
    upstream = RecordingUpstream()
    bearer = "Bearer " + hs256({"sub": "bob"})
    chains = list(judged_chains())
    routes = ""
    for i, (order, edit) in enumerate(chains):
        texts = judged_texts(tmp_path, edit, bearer)
        routes += (f"  - {{name: c{i:03d}, match: {{path_prefix: /c{i:03d}}}, service: s, "
                   f"middlewares: [{', '.join(texts[m] for m in order)}]}}\n")
    server = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, http2: true, access_log: off}}
routes:
{routes}services:
  s: {{url: "http://127.0.0.1:{upstream.port}"}}
""")
    try:
        for i, (order, edit) in enumerate(chains):
            seen = set()
            for n, authorization in enumerate((ALICE, bearer, None)):
                fields = {"authorization": authorization, "x-key": f"client-{n}"}
                path = f"/c{i:03d}/{n}"
                want, forwarded = judged_outcome(order, edit, bearer, fields, seen)
                sent = [(k, v) for k, v in fields.items() if v is not None]
                if protocol == "h2":
                    got = h2_request(server, request_headers(path) + sent)
                else:
                    got = send(server, f"GET {path} HTTP/1.1\r\nHost: a\r\n" +
                               "".join(f"{k}: {v}\r\n" for k, v in sent) + "\r\n")
                assert got == want, (order, edit, authorization, got)
                if want != 200:
                    continue
                up = next(h.decode("latin-1") for h, _ in reversed(upstream.requests)
                          if h.split(b" ")[1] == path.encode())
                for name, value in forwarded.items():
                    assert fields_named(up, name) == ([] if value is None else [value]), (
                        order, edit, authorization, up)
    finally:
        server.stop()
        upstream.stop()
