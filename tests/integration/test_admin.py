"""The admin listener: /metrics read with a real Prometheus text parser (python3-prometheus-
client), /healthz, /ready turning 503 while draining, /config showing the configuration in
force."""
import http.client
import json
import os
import signal
import socket
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Server
from proxy_support import (addr, free_port, gateway, held_dead_port, one_route, request, upstream,
                           wait_until)


def start(build_dir, tmp_path, text):
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                     "--threads", "2"])
    return server, path


def admin_get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.headers, response.read().decode()
    finally:
        conn.close()


def samples(text):
    """Every sample of a /metrics text: {(name, frozenset(labels)): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics, name, **labels):
    return metrics.get((name, frozenset(labels.items())))


def config(admin_port, port, target, dead_port):
    return f"""
admin: {{listen: 127.0.0.1:{admin_port}}}
servers:
  - name: public
    listen: 127.0.0.1:{port}
    access_log: off
routes:
  - {{name: api, match: {{path_prefix: /api/}}, middlewares: [{{strip_prefix: /api}}], service: api}}
  - {{name: gone, match: {{path_prefix: /gone/}}, service: gone}}
  - {{name: half, match: {{path_prefix: /half/}}, middlewares: [{{strip_prefix: /half}}],
     service: half}}
  - {{name: stingy, match: {{path_prefix: /stingy/}}, middlewares: [{{strip_prefix: /stingy}}],
     service: stingy}}
services:
  api: {{url: "http://{addr(target)}"}}
  gone: {{upstream: dead, retries: {{attempts: 1}}}}
  half: {{upstream: half, retries: {{attempts: 2, budget: 100%}}}}
  stingy: {{upstream: half, retries: {{attempts: 2, budget: 0%}}}}
upstreams:
  half:
    targets: [{{address: 127.0.0.1:{dead_port}}}, {{address: "{addr(target)}"}}]
    health: {{passive: {{max_fails: 0}}}}
  dead:
    targets: [{{address: 127.0.0.1:{dead_port}}}]
    health: {{passive: {{max_fails: 2, fail_timeout: 30s}}}}
"""


def test_metrics_count_requests_and_targets_in_the_prometheus_format(build_dir, tmp_path):
    a = upstream(build_dir, "a")
    admin_port, port = free_port(), free_port()
    holder, dead_port = held_dead_port()  # noqa: F841 (held until the test ends)
    gw, path = start(build_dir, tmp_path, config(admin_port, port, a, dead_port))
    try:
        for _ in range(5):
            assert request(gw, "GET", "/api/headers")[0] == 200
        assert request(gw, "GET", "/api/status/404")[0] == 404
        # Round robin over a dead and a live target: every other request is refused by the
        # dead one and retried on the live one. (Before /gone/ takes the dead one out: health
        # is kept by target address.)
        for _ in range(4):
            assert request(gw, "GET", "/half/plaintext")[0] == 200
        # A service with no retry budget beyond the start (10 retries per worker): once they
        # are spent, a request refused by the dead target is not sent again.
        stingy = [request(gw, "GET", "/stingy/plaintext")[0] for _ in range(60)]
        assert stingy.count(502) >= 1 and stingy.count(200) >= 30, stingy
        for _ in range(2):
            assert request(gw, "GET", "/gone/x")[0] == 502
        assert request(gw, "GET", "/plaintext")[0] == 200  # no route: the built-in site

        status, headers, text = admin_get(admin_port, "/metrics")
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        m = samples(text)  # the parser rejects what is not the text format
        assert value(m, "spindle_requests_total", server="public", route="api", code="2xx") == 5
        assert value(m, "spindle_requests_total", server="public", route="api", code="4xx") == 1
        assert value(m, "spindle_requests_total", server="public", route="gone", code="5xx") == 2
        assert value(m, "spindle_requests_total", server="public", route="", code="2xx") == 1
        assert value(m, "spindle_request_duration_seconds_count", server="public",
                     route="api") == 6
        assert value(m, "spindle_request_duration_seconds_bucket", server="public", route="api",
                     le="+Inf") == 6
        assert value(m, "spindle_upstream_first_byte_seconds_count", service="api") == 6
        assert value(m, "spindle_upstream_connect_seconds_count", service="api") == 6
        assert value(m, "spindle_upstream_retries_total", service="half") >= 1
        assert value(m, "spindle_upstream_retries_total", service="api") == 0
        assert value(m, "spindle_upstream_retries_denied_total", service="half") == 0
        assert value(m, "spindle_upstream_retries_total", service="stingy") <= 20
        assert value(m, "spindle_upstream_retries_denied_total",
                     service="stingy") == stingy.count(502)
        # The dead target failed max_fails times, but it is its upstream's only target: one
        # always stays in, and the ejection withheld is counted. The live one is healthy.
        assert value(m, "spindle_upstream_target_healthy", upstream="dead",
                     target=f"127.0.0.1:{dead_port}") == 1
        assert value(m, "spindle_upstream_ejections_withheld_total", service="gone") == 1
        assert value(m, "spindle_upstream_target_healthy", upstream="api.url",
                     target=addr(a)) == 1
        pooled = value(m, "spindle_upstream_connections", upstream="api.url", target=addr(a),
                       state="idle")
        assert pooled is not None and pooled >= 1
        assert value(m, "spindle_ready") == 1
        assert value(m, "spindle_reloads_total", outcome="success") == 0

        # A reload, then a broken one: counted, and the counters of the routes go on.
        def reloads(outcome):
            m = samples(admin_get(admin_port, "/metrics")[2])
            return value(m, "spindle_reloads_total", outcome=outcome) == 1

        gw.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: reloads("success"))
        path.write_text("servers: []\n")
        assert wait_until(lambda: reloads("failure"))
        assert request(gw, "GET", "/api/headers")[0] == 200
        m = samples(admin_get(admin_port, "/metrics")[2])
        assert value(m, "spindle_requests_total", server="public", route="api", code="2xx") == 6
    finally:
        gw.stop()
        a.stop()


def test_request_durations_fall_in_the_buckets_of_their_time(build_dir, tmp_path):
    # A request's duration runs from when its bytes came in (the worker's poll) to its
    # response: a route to an upstream that waits 300 ms lands between 0.25 and 0.5 s, one to
    # a prompt upstream below 0.1 s; neither at 0 nor past every bucket.
    fast, slow = upstream(build_dir, "fast"), upstream(build_dir, "slow", delay_ms=300)
    admin_port, port = free_port(), free_port()
    gw, _ = start(build_dir, tmp_path, f"""
admin: {{listen: 127.0.0.1:{admin_port}}}
servers:
  - {{name: public, listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: fast, match: {{path_prefix: /fast/}}, middlewares: [{{strip_prefix: /fast}}],
     service: fast}}
  - {{name: slow, match: {{path_prefix: /slow/}}, middlewares: [{{strip_prefix: /slow}}],
     service: slow}}
services:
  fast: {{url: "http://{addr(fast)}"}}
  slow: {{url: "http://{addr(slow)}"}}
""")
    try:
        for _ in range(4):
            assert request(gw, "GET", "/fast/plaintext")[0] == 200
        for _ in range(2):
            assert request(gw, "GET", "/slow/plaintext")[0] == 200
        m = samples(admin_get(admin_port, "/metrics")[2])

        def bucket(route, le):
            return value(m, "spindle_request_duration_seconds_bucket", server="public",
                         route=route, le=le)

        assert bucket("fast", "0.1") == 4 and bucket("fast", "+Inf") == 4
        assert bucket("slow", "0.25") == 0
        assert bucket("slow", "0.5") == 2 and bucket("slow", "+Inf") == 2
        total = value(m, "spindle_request_duration_seconds_sum", server="public", route="slow")
        assert 0.6 <= total < 1.0, total
    finally:
        gw.stop()
        fast.stop()
        slow.stop()


def test_requests_waiting_for_a_targets_connections_are_a_gauge(build_dir, tmp_path):
    # One worker, one connection allowed to a target that answers after 1.5 s: of three
    # requests at once, one is on the connection and two wait their turn; then none.
    slow = upstream(build_dir, "slow", delay_ms=1500)
    admin_port, port = free_port(), free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(f"""
admin: {{listen: 127.0.0.1:{admin_port}}}
servers:
  - {{name: public, listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: slow, match: {{path_prefix: /}}, service: slow}}
services:
  slow: {{upstream: slow}}
upstreams:
  slow:
    targets: [{{address: "{addr(slow)}"}}]
    limits: {{max_connections: 1}}
""")
    gw = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                 "--threads", "1"])
    gw.port = port

    def waiting():
        m = samples(admin_get(admin_port, "/metrics")[2])
        return value(m, "spindle_upstream_requests_waiting", upstream="slow", target=addr(slow))

    try:
        assert waiting() == 0
        statuses = []
        threads = [threading.Thread(target=lambda: statuses.append(
            request(gw, "GET", "/plaintext")[0])) for _ in range(3)]
        for t in threads:
            t.start()
        assert wait_until(lambda: waiting() == 2), waiting()
        for t in threads:
            t.join()
        assert statuses == [200, 200, 200]
        assert waiting() == 0
    finally:
        gw.stop()
        slow.stop()


def test_healthz_config_and_ready_while_draining(build_dir, tmp_path):
    a = upstream(build_dir, "a")
    admin_port, port = free_port(), free_port()
    holder, dead_port = held_dead_port()  # noqa: F841 (held until the test ends)
    gw, _ = start(build_dir, tmp_path, config(admin_port, port, a, dead_port))
    try:
        assert admin_get(admin_port, "/healthz")[:1] == (200,)
        assert admin_get(admin_port, "/ready")[0] == 200
        status, headers, text = admin_get(admin_port, "/config")
        assert status == 200 and headers["content-type"] == "application/yaml"
        assert f"listen: 127.0.0.1:{port}" in text and "name: api" in text
        # The admin listener serves only its own routes.
        assert admin_get(admin_port, "/api/headers")[0] == 404

        # While a request drains, /ready says 503 and /healthz still 200.
        done = {}

        def slow():
            done["status"] = request(gw, "GET", "/api/delay/1500")[0]

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.3)
        gw.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 1
        seen = None
        while time.monotonic() < deadline and seen != 503:
            seen = admin_get(admin_port, "/ready")[0]
            time.sleep(0.05)
        assert seen == 503
        assert admin_get(admin_port, "/healthz")[0] == 200
        thread.join()
        assert done["status"] == 200
        assert gw.proc.wait(timeout=10) == 0
    finally:
        gw.stop()
        a.stop()


def test_there_is_no_admin_listener_unless_configured(build_dir, tmp_path):
    port = free_port()
    gw, _ = start(build_dir, tmp_path, f"servers:\n  - listen: 127.0.0.1:{port}\n")
    try:
        time.sleep(0.3)
        assert all("admin_listening" not in line for line in gw.output)
    finally:
        gw.stop()


def test_config_redacts_secret_fields_whatever_their_case(build_dir, tmp_path, recorder):
    admin = free_port()
    routes = """  - name: all
    match: {path_prefix: /}
    middlewares:
      - headers:
          request:
            set: {Authorization: "Bearer s3cr3t-1", X-Api-Key: s3cr3t-2, X-Auth-Token: s3cr3t-3,
                  Cookie: "sid=s3cr3t-4", X-Plain: visible}
    service: s
"""
    text = one_route(recorder, routes=routes) + f"admin: {{listen: 127.0.0.1:{admin}}}\n"
    server = gateway(build_dir, tmp_path, text)
    try:
        with socket.create_connection(("127.0.0.1", admin), timeout=5) as s:
            s.sendall(b"GET /config HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            shown = b""
            while chunk := s.recv(65536):
                shown += chunk
        assert b"s3cr3t" not in shown, shown
        # (Every value the headers middleware sets is hidden, whatever its name:
        # test_config_redaction.py.)
        assert shown.count(b"<redacted>") == 5, shown
        assert b"X-Plain" in shown
    finally:
        server.stop()
