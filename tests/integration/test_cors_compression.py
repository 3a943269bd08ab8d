"""The `cors` and `compression` route middlewares through the spindle binary, over HTTP/1.1 and
HTTP/2: every answer of a route with cors varies on Origin; origin wildcards match subdomains
and nothing else; check-config refuses what browsers would refuse; compression leaves alone
what RFC 9110 says an intermediary must not transform."""
import gzip

import h2.events
import h2.settings
import pytest

from proxy_support import (SERVER, RecordingUpstream, h2_connect, h2_events_until,
                           middleware_config_error, one_route, request, request_headers,
                           services_to)


@pytest.fixture
def upstream(stage):
    return stage.upstream("a")


def h2_requests(server, requests):
    """Sends each (method, path, [(name, value)]) of `requests` on one HTTP/2 connection:
    for each, its answer's fields ({name: [values]}, names in lower case) and body."""
    s, conn = h2_connect(server)
    # Windows for every body at once: nothing here gives flow-control credit back.
    conn.increment_flow_control_window(1 << 24)
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
    ids = []
    for method, path, fields in requests:
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, request_headers(path, method) + fields, end_stream=True)
        ids.append(stream)
    s.sendall(conn.data_to_send())
    events = h2_events_until(s, conn, lambda ev: sum(
        isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev) >= len(ids))
    s.close()
    heads, bodies = {}, {i: b"" for i in ids}
    for e in events:
        if isinstance(e, h2.events.ResponseReceived):
            fields = {}
            for name, value in e.headers:
                fields.setdefault(name.decode().lower(), []).append(value.decode())
            heads[e.stream_id] = fields
        elif isinstance(e, h2.events.DataReceived):
            bodies[e.stream_id] += e.data
    return [(heads.get(i), bodies[i]) for i in ids]


def vary_tokens(values):
    """The items of the Vary fields `values`, in lower case."""
    return [t.strip().lower() for v in values for t in v.split(",") if t.strip()]


CORS_ROUTES = """
routes:
  - name: listed
    match: {path_prefix: /listed/}
    middlewares:
      - cors: {origins: ["https://app.example", "https://*.example.com"], methods: [GET, PUT],
               credentials: true}
      - strip_prefix: /listed
    service: a
  - name: anyone
    match: {path_prefix: /anyone/}
    middlewares: [{cors: {origins: "*"}}, {strip_prefix: /anyone}]
    service: a
  - name: plain
    match: {path_prefix: /}
    service: a
"""


def cors_requests(prefix):
    """(what, method, path, fields) for every kind of request a route with cors answers."""
    ask = [("access-control-request-method", "PUT")]
    return [
        ("allowed", "GET", prefix + "/plaintext", [("origin", "https://app.example")]),
        ("allowed by wildcard", "GET", prefix + "/plaintext",
         [("origin", "https://a.b.example.com")]),
        ("refused", "GET", prefix + "/plaintext", [("origin", "https://evil.example")]),
        ("no origin", "GET", prefix + "/plaintext", []),
        ("no origin, upstream 404", "GET", prefix + "/status/404", []),
        ("refused, upstream 404", "GET", prefix + "/status/404",
         [("origin", "https://evil.example")]),
        ("preflight", "OPTIONS", prefix + "/plaintext", [("origin", "https://app.example")] + ask),
        ("refused preflight", "OPTIONS", prefix + "/plaintext",
         [("origin", "https://evil.example")] + ask),
        ("OPTIONS without a method asked", "OPTIONS", prefix + "/plaintext",
         [("origin", "https://app.example")]),
    ]


def test_every_answer_of_a_cors_route_varies_on_origin_once(stage, upstream):
    gw = stage.gateway(SERVER + CORS_ROUTES + services_to(a=upstream))
    for prefix in ("/listed", "/anyone"):
        cases = cors_requests(prefix)
        over_h2 = h2_requests(gw, [(m, p, f) for _, m, p, f in cases])
        for (what, method, path, fields), (h2_head, _) in zip(cases, over_h2):
            status, head, _ = request(gw, method, path, headers=dict(fields))
            for protocol, values in (("HTTP/1.1", head.get_all("Vary") or []),
                                     ("HTTP/2", h2_head.get("vary", []))):
                assert vary_tokens(values).count("origin") == 1, (prefix, what, protocol, values)
    # A route without cors answers as it did.
    status, head, _ = request(gw, "GET", "/plaintext", headers={"Origin": "https://app.example"})
    assert status == 200 and "origin" not in vary_tokens(head.get_all("Vary") or [])


ALLOWED = ["https://a.example.com", "https://a.b.example.com", "https://A.Example.COM",
           "https://x-1.y_2.example.com", "https://app.example", "https://APP.example"]
IMPOSTORS = ["https://example.com", "https://evil-example.com", "https://example.com.evil.com",
             "https://a.example.com.evil.com", "https://a.example.com.", "https://.example.com",
             "https://a..example.com", "https://a.example.com:443", "https://a.example.com:8443",
             "http://a.example.com", "https://evil.com@a.example.com",
             "https://a.example.com@evil.com", "https://evil.com:@a.example.com",
             "https://a.example.com/", "https://*.example.com", "https://app.example:443",
             "https://app.example.", "https://xapp.example", "null"]


def test_an_origin_wildcard_allows_subdomains_and_no_lookalike(stage, upstream):
    gw = stage.gateway(SERVER + CORS_ROUTES + services_to(a=upstream))
    cases = [(o, True) for o in ALLOWED] + [(o, False) for o in IMPOSTORS]
    over_h2 = h2_requests(gw, [("GET", "/listed/plaintext", [("origin", o)]) for o, _ in cases])
    for (origin, allowed), (h2_head, _) in zip(cases, over_h2):
        _, head, _ = request(gw, "GET", "/listed/plaintext", headers={"Origin": origin})
        for protocol, acao in (("HTTP/1.1", head.get("Access-Control-Allow-Origin")),
                               ("HTTP/2", (h2_head.get("access-control-allow-origin") or [None])[0])):
            assert acao == (origin if allowed else None), (origin, protocol, acao)
        status, head, _ = request(gw, "OPTIONS", "/listed/plaintext", headers={
            "Origin": origin, "Access-Control-Request-Method": "PUT"})
        assert status == (204 if allowed else 403), origin


@pytest.mark.parametrize("cors,why", [
    ('{origins: ["https://*example.com"]}', "cors.origins: 'https://*example.com' is not an origin"),
    ('{origins: ["https://a.*.example.com"]}', "cors.origins: 'https://a.*.example.com' is not"),
    ('{origins: ["*.example.com"]}', "cors.origins: '*.example.com' is not an origin"),
    ('{origins: ["https://*.example.com/"]}', "cors.origins: 'https://*.example.com/' is not"),
    ('{origins: ["https://app.example/path"]}', "cors.origins: 'https://app.example/path' is not"),
    ('{origins: ["https://user@app.example"]}', "cors.origins: 'https://user@app.example' is not"),
    ('{origins: "*", credentials: true}', "cors.credentials: true cannot go with origins: *"),
    ('{origins: [https://app.example], credentials: true, expose: ["*"]}',
     "cors.expose: '*' exposes nothing with credentials: true"),
    ('{origins: [https://app.example], methods: ["*"]}', "cors.methods: '*' is not a method"),
])
def test_check_config_refuses_a_cors_browsers_would_not_follow(build_dir, tmp_path, cors, why):
    err = middleware_config_error(build_dir, tmp_path, f"[{{cors: {cors}}}]")
    assert f"bad.yaml:5: routes[0].middlewares[0].{why}" in err, err


PLAIN = b"x" * 4000


def no_transform_fields():
    """Cache-Control fields saying no-transform: four spellings of case; alone, first, among
    or last of other directives; in a field of its own before or after another."""
    out = []
    for spelling in ("no-transform", "No-Transform", "NO-TRANSFORM", "nO-tRaNsFoRm"):
        for value in (spelling, spelling + ",max-age=60", "public, " + spelling + " ,max-age=60",
                      'private="x",\t' + spelling):
            out += [[value], ["max-age=60", value], [value, "public"]]
    return out


# What the upstream answers for /case/N (the list's Nth), all for a text body of 4000 bytes.
ANSWERS = ([{"Cache-Control": fields} for fields in no_transform_fields()] + [
    {"Content-Encoding": ["gzip"], "body": gzip.compress(PLAIN)},
    {"status": "206 Partial Content", "Content-Range": ["bytes 0-3999/8000"]},
    {"status": "304 Not Modified", "body": b""},
    {"status": "204 No Content", "body": b""},
])
CONTROL = len(ANSWERS)  # /case/CONTROL: no Cache-Control at all (compressed)


class ScriptedAnswers(RecordingUpstream):
    """Answers /case/N with ANSWERS[N], and anything else with PLAIN as text/plain."""

    def answer(self, head, body):
        target = head.split(b" ", 2)[1].decode()
        n = int(target.rsplit("/", 1)[1]) if target.startswith("/case/") else CONTROL
        spec = ANSWERS[n] if n < len(ANSWERS) else {}
        content = spec.get("body", PLAIN)
        lines = [f"HTTP/1.1 {spec.get('status', '200 OK')}", "Content-Type: text/plain"]
        for name, values in spec.items():
            if name not in ("status", "body"):
                lines += [f"{name}: {v}" for v in values]
        if not spec.get("status", "").startswith(("204", "304")):
            lines.append(f"Content-Length: {len(content)}")
        if head.startswith(b"HEAD ") or not content:
            content = b""
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + content


@pytest.fixture
def scripted():
    server = ScriptedAnswers()
    yield server
    server.stop()


def test_compression_leaves_alone_what_it_must_not_transform(stage, scripted):
    routes = ("  - {name: all, match: {path_prefix: /}, service: s,\n"
              "     middlewares: [{compression: {min_size: 1k}}]}\n")
    gw = stage.gateway(one_route(scripted, routes=routes))
    paths = [f"/case/{n}" for n in range(len(ANSWERS))]
    accept = [("accept-encoding", "gzip, br")]
    over_h2 = h2_requests(gw, [("GET", p, accept) for p in paths + [f"/case/{CONTROL}"]])
    for n, path in enumerate(paths):
        want = ANSWERS[n].get("body", PLAIN)
        status, head, body = request(gw, "GET", path, headers=dict(accept))
        h2_head, h2_body = over_h2[n]
        assert head.get_all("Content-Encoding") == ANSWERS[n].get("Content-Encoding"), (n, head)
        assert h2_head.get("content-encoding") == ANSWERS[n].get("Content-Encoding"), (n, h2_head)
        assert body == want and h2_body == want, (n, ANSWERS[n])
    # HEAD: as the upstream sent it, whatever the protocol.
    status, head, _ = request(gw, "HEAD", f"/case/{CONTROL}", headers=dict(accept))
    h2_head, _ = h2_requests(gw, [("HEAD", f"/case/{CONTROL}", accept)])[0]
    assert status == 200 and "Content-Encoding" not in head, head
    assert "content-encoding" not in h2_head, h2_head
    # The same answer without any of these: compressed, both ways.
    status, head, body = request(gw, "GET", f"/case/{CONTROL}", headers={"Accept-Encoding": "gzip"})
    assert head["Content-Encoding"] == "gzip" and gzip.decompress(body) == PLAIN
    assert over_h2[-1][0]["content-encoding"] == ["br"]
