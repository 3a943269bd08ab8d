"""What the services behind the gateway understood (issue 67): real frameworks as upstreams — a
Flask app on Werkzeug's server, an Express app and a Go net/http server
(tests/frameworks/) — each printing what it understood of every request it got: method, host,
path, query, credentials, identity fields, cookies, forwarded fields. Generated requests, each
ambiguous in its own way (duplicates, case and '_' spellings, absolute-form, encoded paths,
several Cookie fields, split writes; HTTP/1.1, HTTP/2 and RFC 8441), go through routes with
basic_auth, jwt (Bearer and cookie), forward_auth and mirror. For each the property holds:
either the gateway refused it (4xx), or every service that got it — the upstream, the mirror
target, the auth service — understood exactly what the gateway judged (its access log line:
method, target, host, route, user) and what the route's middlewares verified."""
import base64
import hashlib
import hmac
import json
import os
import random
import re
import socket
import subprocess
import time
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import pytest

from conftest import ROOT, Server
from proxy_support import gateway, wait_until

SEED = int(os.environ.get("SPINDLE_PROPERTY_SEED", "67"))
REQUESTS = 300  # per framework
KEY = b"canonical-request-test-key-32by!"
PASSWORDS = {"alice": "secret", "bob": "hunter2"}
ROUTES = ["basic", "writes", "jwt", "cookie", "fa", "mirrored", "admin-host", "public"]
PREFIXES = {"basic": "/basic", "writes": "/w", "jwt": "/jwt", "cookie": "/cookie", "fa": "/fa",
            "mirrored": "/m"}


# ---- the services -------------------------------------------------------------------------


def framework(kind, name):
    """Starts framework `kind` (flask, express, go) as a service that prints, a line each, what
    it understood of every request."""
    if kind == "flask":
        argv = ["/usr/bin/python3", os.path.join(ROOT, "tests/frameworks/flask_echo.py"), name]
        return Server(argv)
    if kind == "express":
        argv = ["node", os.path.join(ROOT, "tests/frameworks/express/echo.js"), name]
        return Server(argv, env={"NODE_PATH": os.path.join(ROOT, "build/tools/express/node_modules")})
    return Server([os.path.join(ROOT, "build/tools/go-echo"), name])


@pytest.fixture(scope="module")
def installed():
    """Express's packages and the Go server, built once (scripts/install-*.sh). Fails (never
    skips) when a framework is missing: each is installable (scripts/install-deps.sh test)."""
    flask = subprocess.run(["/usr/bin/python3", "-c", "import flask"], capture_output=True,
                           text=True)
    assert flask.returncode == 0, \
        f"Flask is missing (scripts/install-deps.sh test installs python3-flask): {flask.stderr}"
    for script in ("install-express.sh", "install-go-echo.sh"):
        done = subprocess.run([os.path.join(ROOT, "scripts", script)], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr


def understood(service):
    """What `service` printed it understood, one dict per request, in order."""
    return [json.loads(line) for line in list(service.output) if line.startswith("{")]


# ---- credentials ------------------------------------------------------------------------------


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(sub, role, forged=False):
    claims = {"sub": sub, "role": role, "exp": int(time.time()) + 3600}
    head = b64url(json.dumps({"alg": "none" if forged else "HS256", "kid": "k"}).encode())
    body = b64url(json.dumps(claims).encode())
    mac = b"" if forged else hmac.new(KEY, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(mac)}"


def claims_of(jwt):
    body = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def gateway_config(tmp_path, app, mirror, auth):
    (tmp_path / "keys.json").write_text(json.dumps(
        {"keys": [{"kty": "oct", "kid": "k", "k": b64url(KEY)}]}))
    (tmp_path / "users").write_text("".join(
        f"{u}:{{SHA}}{base64.b64encode(hashlib.sha1(p.encode()).digest()).decode()}\n"
        for u, p in PASSWORDS.items()))
    users = f"{{basic_auth: {{users_file: {tmp_path / 'users'}}}}}"
    jwt = (f"jwt: {{jwks_file: {tmp_path / 'keys.json'}, "
           f"claims_to_headers: {{sub: X-User, role: X-Role}}")
    return f"""
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: {{format: json}}
routes:
  - {{name: basic, match: {{path_prefix: /basic}}, middlewares: [{users}], service: app}}
  - name: writes
    match: {{path_prefix: /w, methods: [PUT, POST, PATCH, DELETE]}}
    middlewares: [{users}]
    service: app
  - {{name: jwt, match: {{path_prefix: /jwt}}, middlewares: [{{{jwt}}}}}], service: app}}
  - {{name: cookie, match: {{path_prefix: /cookie}}, middlewares: [{{{jwt}, cookie: token}}}}],
     service: app}}
  - name: fa
    match: {{path_prefix: /fa}}
    middlewares: [{{forward_auth: {{service: auth, path: /verify, response_headers: [X-User]}}}}]
    service: app
  - name: mirrored
    match: {{path_prefix: /m}}
    middlewares: [{{{jwt}}}}}, {{mirror: {{service: mirror}}}}]
    service: app
  - {{name: admin-host, match: {{hosts: [admin.example.com]}}, middlewares: [{users}],
     service: app}}
  - {{name: public, match: {{path_prefix: /}}, service: app}}
services:
  app: {{url: "http://{app.host}:{app.port}"}}
  mirror: {{url: "http://{mirror.host}:{mirror.port}"}}
  auth: {{url: "http://{auth.host}:{auth.port}"}}
"""


# ---- generated requests -----------------------------------------------------------------------


def spelt(rng, name, underscore=False):
    """`name` in a random case; with `underscore`, some of its '-' as '_'."""
    out = "".join(c.upper() if rng.random() < 0.3 else c.lower() for c in name)
    return out.replace("-", "_", rng.randrange(1, 3)) if underscore and "-" in out else out


# What may make a request ambiguous; each generated request has none, one or two.
TROUBLES = ["method", "path", "host", "authority", "no-host", "authorization", "owned-twice",
            "underscore", "underscore-known", "cookie-twice", "cookie-misspelt", "singleton"]
CREDENTIALS = {
    "/basic": [basic("alice", "secret"), basic("bob", "hunter2"), basic("bob", "wrong")],
    "/jwt": ["Bearer " + token("alice", "admin"), "Bearer " + token("bob", "user"),
             "Bearer " + token("mallory", "admin", forged=True)],
    "/fa": ["Bearer ok-alice", "Bearer ok-bob", "Bearer nobody"]}
CREDENTIALS["/w"] = CREDENTIALS["/basic"]
CREDENTIALS["/m"] = CREDENTIALS["/jwt"]
OWNED = [("x-user", "mallory"), ("x-role", "admin"), ("x-forwarded-for", "10.0.0.1"),
         ("x-forwarded-host", "admin.example.com"), ("x-forwarded-proto", "https"),
         ("x-forwarded-uri", "/pub"), ("x-forwarded-method", "GET"),
         ("forwarded", "for=10.0.0.1;host=admin.example.com"), ("x-real-ip", "10.0.0.1"),
         ("x-original-url", "/basic"), ("x-http-method-override", "DELETE")]


def generate_target(rng, trouble, protocol, host):
    """The path (dot segments, escapes, merged slashes; with "path" trouble, an escape that is
    refused) and query, sometimes in absolute-form (with "authority" trouble, naming another
    host than Host)."""
    prefix = rng.choice(list(PREFIXES.values()) + ["/pub", "/"])
    pieces = ["x", "..", ".", "%2e%2e", "%2E", "%61dmin", "", "a%20b", "jwt", "basic", "fa", "m",
              "w", "%77", "%62asic"] + (["%2F", "%5C", "%00", "a%"] if "path" in trouble else [])
    tail = "/".join(rng.choice(pieces) for _ in range(rng.randrange(4)))
    path = (prefix + "/" + tail) if tail else prefix
    if rng.random() < 0.2:
        path = "/pub/.." + path
    target = path + rng.choice(["", "", "?q=1", "?a=%2F&b", "?x=../admin"])
    if protocol == "h1" and (rng.random() < 0.2 or "authority" in trouble):
        named = "other.example.com" if "authority" in trouble else rng.choice([host, host.upper()])
        target = f"{rng.choice(['http', 'HTTP', 'https'])}://{named}{target}"
    return prefix, target


def generate(rng, n):
    """Request n: (protocol, method, target, fields), fields a list of (name, value)."""
    trouble = set(rng.sample(TROUBLES, rng.choice([0, 0, 0, 1, 1, 2])))
    protocol = rng.choices(["h1", "h2", "ws"], [6, 3, 1])[0]
    method = rng.choice(["GET", "GET", "GET", "POST", "PUT", "PATCH", "DELETE", "PURGE"])
    if "method" in trouble:
        method = "purge"
    method = "".join(c.lower() if rng.random() < 0.3 and method != "PURGE" else c for c in method)
    host = rng.choice(["app.example.com", "app.example.com", "APP.example.com.",
                       "app.example.com:8080", "127.0.0.1", "[::1]:8443", "admin.example.com",
                       "ADMIN.example.com."])
    if "host" in trouble:
        host = rng.choice(["admin.example.com@evil.com", "evil.com/.admin.example.com",
                           "evil.com#.admin.example.com", "evil.com?.admin.example.com",
                           "admin.example.com:99999", "admin.example.com,evil.com"])
    prefix, target = generate_target(rng, trouble, protocol, host)
    fields = [("X-Request-Id", f"rq-{SEED}-{n}")]
    if "no-host" not in trouble or protocol != "h1":
        fields.append(("Host" if protocol == "h1" else "host", host))
    if "authority" in trouble and protocol != "h1":
        fields.append(("host", "other.example.com"))
    every = sum(CREDENTIALS.values(), [])
    fitting = CREDENTIALS["/basic" if "admin" in host.lower() else prefix] \
        if "admin" in host.lower() or prefix in CREDENTIALS else every
    for _ in range(2 if "authorization" in trouble else rng.choice([0, 1, 1, 1])):
        fields.append((spelt(rng, "authorization"),
                       rng.choice(fitting if rng.random() < 0.8 else every)))
    good, forged = f"token={token('bob', 'user')}", token("eve", "admin", forged=True)
    cookie = [good if prefix == "/cookie" else rng.choice([good, "theme=dark"])]
    if "cookie-twice" in trouble:
        cookie.insert(rng.randrange(2), f"token={forged}")
    if "cookie-misspelt" in trouble:
        cookie = [rng.choice([f"token ={forged}", f"%74oken={forged}"])]
    if rng.random() < 0.5 and len(cookie) > 1:
        fields += [("Cookie", c) for c in cookie]  # several Cookie fields
    elif rng.random() < 0.8:
        fields.append(("Cookie", "; ".join(cookie)))
    for name, value in rng.sample(OWNED, rng.randrange(3)):
        fields.append((spelt(rng, name, underscore="underscore-known" in trouble), value))
    # An identity field the routes write, spelt with '_' (WSGI reads it as the field), or twice.
    name, value = rng.choice(OWNED[:2])
    if "underscore" in trouble:
        fields.append((spelt(rng, name, underscore=True), value))
    if "owned-twice" in trouble:
        fields += [(spelt(rng, name), value), (spelt(rng, name), value)]
    if "singleton" in trouble:
        fields += [(spelt(rng, "content-type"), "text/plain"), ("Content-Type", "text/html")]
    rng.shuffle(fields)
    if protocol != "h1":
        fields = [(name.lower(), value) for name, value in fields]
    return protocol, method, target, fields


def send_h1(server, rng, method, target, fields):
    body = b""
    head = f"{method} {target} HTTP/1.1\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in fields)
    head += "Content-Length: 0\r\nConnection: close\r\n\r\n"
    data = head.encode("latin-1") + body
    cuts = sorted(rng.sample(range(1, len(data)), min(3, len(data) - 1)))
    with socket.create_connection((server.host, server.port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for a, b in zip([0] + cuts, cuts + [len(data)]):
            s.sendall(data[a:b])
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else None


def send_h2(server, method, target, fields, websocket=False):
    s = socket.create_connection((server.host, server.port), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False,
        validate_inbound_headers=False))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    host = [v for n, v in fields if n == "host"]
    rest = [(n, v) for n, v in fields if n != "host"] + [("host", v) for v in host[1:]]
    if websocket:
        pseudo = [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
                  (":path", target), (":authority", host[0] if host else "app.example.com")]
        rest.append(("sec-websocket-version", "13"))
    else:
        pseudo = [(":method", method), (":scheme", "http"), (":path", target)]
        if host:
            pseudo.append((":authority", host[0]))
    status = None
    try:
        if websocket:
            while conn.remote_settings.enable_connect_protocol != 1:
                for e in conn.receive_data(s.recv(65536)):
                    pass
                s.sendall(conn.data_to_send())
        conn.send_headers(1, pseudo + rest, end_stream=not websocket)
        s.sendall(conn.data_to_send())
        deadline = time.monotonic() + 10
        while status is None and time.monotonic() < deadline:
            data = s.recv(65536)
            if not data:
                break
            for e in conn.receive_data(data):
                if isinstance(e, h2.events.ResponseReceived):
                    status = int(dict(e.headers)[b":status"])
                if isinstance(e, h2.events.StreamReset):
                    status = status or 0
            s.sendall(conn.data_to_send())
    finally:
        s.close()
    return status


# ---- what the gateway judged, and what each service must have understood ----------------------


def judged_route(method, host, path):
    """The route the configuration gives a request with this method, host (without port or
    trailing dot, lower case) and decoded path."""
    if host == "admin.example.com":
        return "admin-host"
    if path.startswith("/w") and method in ("PUT", "POST", "PATCH", "DELETE"):
        return "writes"
    for route, prefix in PREFIXES.items():
        if route != "writes" and path.startswith(prefix):
            return route
    return "public"


def host_name(authority):
    host = authority.lower()
    if not host.startswith("[") and ":" in host:
        host = host.rsplit(":", 1)[0]
    return host.rstrip(".")


def single(fields, name):
    """The one value of field `name` (any case) the client sent in `fields`, or None: the gateway
    let the request through, so there were not two."""
    values = [v for n, v in fields if n.lower() == name]
    assert len(values) <= 1, f"a request with {len(values)} {name} fields went through: {values}"
    return values[0] if values else None


def check_understood(seen, judged, sent, decodes_path):
    """`seen`: what a service understood; `judged`: the gateway's access log line for it; `sent`:
    the generated request."""
    why = (seen, judged, sent)
    protocol, _, _, fields = sent
    target_path, _, query = judged["target"].partition("?")
    # An HTTP/2 WebSocket (CONNECT with :protocol) goes on as the GET upgrade it stands for.
    assert seen["method"] == ("GET" if protocol == "ws" else judged["method"]), why
    assert seen["host"].lower() == judged["host"].lower(), why
    assert seen["forwarded_host"].lower() == judged["host"].lower(), why
    assert seen["forwarded_for"] == "127.0.0.1" and seen["forwarded_proto"] == "http", why
    assert seen["path"] == (unquote(target_path) if decodes_path else target_path), why
    assert seen["query"] == query, why
    route = judged["route"]
    assert route == judged_route(seen["method"], host_name(seen["host"]), unquote(seen["path"])), \
        why
    # (Werkzeug's server answers a WebSocket upgrade without switching: a 502 from the gateway.)
    assert judged["status"] == 200 or protocol == "ws" and judged["status"] == 502, why
    authorization = single(fields, "authorization")
    # A jwt that reads its token from a cookie verifies no Authorization: none goes on.
    assert seen["authorization"] == (None if route == "cookie" else authorization), why
    if route in ("basic", "writes", "admin-host"):
        assert seen["basic_user"] == judged["user"] and judged["user"] in PASSWORDS, why
    elif route in ("jwt", "mirrored"):
        claims = claims_of(authorization.split(" ", 1)[1])
        assert seen["user"] == judged["user"] == claims["sub"], why
        assert seen["role"] == claims["role"], why
    elif route == "cookie":
        verified = seen["cookies"]["token"]
        claims = claims_of(verified)
        assert seen["user"] == judged["user"] == claims["sub"] == "bob", why
        assert seen["role"] == claims["role"], why
    elif route == "fa":
        assert authorization.startswith("Bearer ok-"), why
        assert seen["user"] == authorization.removeprefix("Bearer ok-"), why


def check_auth_request(seen, judged):
    """What the auth service understood of its sub-request for the request `judged`."""
    why = (seen, judged)
    assert seen["path"] == "/verify" and seen["method"] == "GET", why
    # An HTTP/2 WebSocket (CONNECT with :protocol) is asked about as the GET the upstream gets.
    method = "GET" if judged["method"] == "CONNECT" else judged["method"]
    assert seen["forwarded_method"] == method, why
    assert seen["forwarded_uri"] == judged["target"], why
    assert seen["forwarded_host"].lower() == judged["host"].lower(), why
    assert seen["forwarded_for"] == "127.0.0.1" and seen["forwarded_proto"] == "http", why


def outputs(gw, app, mirror, auth):
    """What the upstream, the mirror target and the auth service printed so far, and the
    gateway's access log lines by request id."""
    log = {j.get("request_id"): j for j in map(json.loads, (
        line for line in list(gw.output) if line.startswith("{")))}
    return understood(app), understood(mirror), understood(auth), log


def settled(gw, app, mirror, auth, statuses):
    """True once every request answered 200 was printed by the upstream, every request the
    gateway routed to forward_auth by the auth service, and every request a service printed is
    in the access log."""
    got, copies, asked, log = outputs(gw, app, mirror, auth)
    reached, questioned = {s["request_id"] for s in got}, {s["request_id"] for s in asked}
    return (all(rid in reached for rid, status in statuses.items() if status == 200) and
            all(rid in questioned for rid, line in log.items() if line.get("route") == "fa") and
            all(s["request_id"] in log for s in got + copies + asked))


@pytest.mark.parametrize("kind", ["flask", "express", "go"])
def test_every_service_understood_what_the_gateway_judged(build_dir, tmp_path, installed, kind):
    rng = random.Random(f"{SEED}-{kind}")
    app, mirror, auth = framework(kind, kind), framework(kind, f"{kind}-mirror"), \
        framework("flask", "auth")
    gw = gateway(build_dir, tmp_path, gateway_config(tmp_path, app, mirror, auth))
    sent, statuses = {}, {}
    try:
        for n in range(REQUESTS):
            protocol, method, target, fields = request = generate(rng, n)
            rid = f"rq-{SEED}-{n}"
            sent[rid] = request
            if protocol == "h1":
                statuses[rid] = send_h1(gw, rng, method, target, fields)
            else:
                statuses[rid] = send_h2(gw, method, target, fields, websocket=protocol == "ws")
            assert statuses[rid] is not None, request
        # The services' and the gateway's lines are read by threads of their own, and may
        # come after the answers: wait until what was seen covers what was answered.
        wait_until(lambda: settled(gw, app, mirror, auth, statuses), seconds=10)
        got, copies, asked, log = outputs(gw, app, mirror, auth)
        assert all(s["request_id"] in log for s in got + copies + asked), \
            "the access log lacks requests the services got"
    finally:
        gw.stop()
        for service in (app, mirror, auth):
            service.stop()
    decodes = kind != "express"  # (Express's req.path is the path as sent)
    for seen in got + copies:
        check_understood(seen, log[seen["request_id"]], sent[seen["request_id"]], decodes)
    # The auth service was asked once for each request routed to forward_auth's route (and
    # for no other), and understood what the gateway judged.
    assert sorted(s["request_id"] for s in asked) == \
        sorted(r for r, line in log.items() if line.get("route") == "fa"), asked
    for seen in asked:
        check_auth_request(seen, log[seen["request_id"]])
    # Whatever reached no service was refused by the gateway (or by an auth middleware); an
    # HTTP/2 stream may be reset instead (0: a field value the protocol forbids, RFC 9113 8.2.1).
    reached = {s["request_id"] for s in got}
    for rid, status in statuses.items():
        if rid not in reached:
            assert 400 <= status < 500 or status == 0 and sent[rid][0] != "h1", \
                (rid, status, sent[rid])
    # Enough of each kind got through, and enough was refused, for the property to mean
    # something.
    routes = {log[r]["route"] for r in reached}
    assert {"basic", "jwt", "cookie", "fa", "public"} <= routes, routes
    assert REQUESTS // 6 < len(reached) < REQUESTS, len(reached)
    assert any(s["request_id"].startswith("rq-") for s in copies), "no mirror copy"
