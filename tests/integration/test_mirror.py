"""mirror: a copy of each request goes to another service, fire-and-forget. The copy carries
the request as it goes upstream (small bodies too), never slows the request (a shadow service
that takes seconds costs it nothing), is dropped beyond max_in_flight, and a shadow service that
is down changes nothing for the client; a trickling shadow frees its slots and cannot hold a
shutdown."""
import http.client
import http.server
import json
import signal
import socket
import threading
import time

import h2.events
import h2.exceptions
import h2.settings
import pytest

from proxy_support import (HostileShadow, RecordingUpstream, SERVER, ScriptedUpstream, addr,
                           free_port, gateway, h2_connect, h2_events_until, held_dead_port,
                           mirrored, read_request, read_request_head, request, request_headers,
                           response_status, wait_until)


class Shadow:
    """Records each request (method, path, fields, body), answering after `delay` seconds."""

    def __init__(self, delay=0.0):
        got = self.got = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length) if length else b""
                time.sleep(delay)
                got.append((self.command, self.path,
                            {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(500)  # whatever it says is thrown away
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def mirror_gateway(build_dir, tmp_path, target, shadow_address, settings=""):
    log = tmp_path / "access.json"
    gw = gateway(build_dir, tmp_path, SERVER.replace(
        "access_log: off", f"access_log: {{path: {log}, format: json}}") + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - headers: {{request: {{set: {{x-env: test}}}}}}
      - mirror: {{service: shadow{settings}}}
    service: a
services:
  a: {{url: "http://{addr(target)}"}}
  shadow: {{url: "http://{shadow_address}", timeouts: {{first_byte: 10s}}}}
""", threads=1)
    return gw, log


def mirror_marks(log, count):
    """The "mirror" attribute of the first `count` requests of the access log."""
    def read():
        lines = log.read_text().splitlines() if log.exists() else []
        return [json.loads(line).get("mirror") for line in lines] if len(lines) >= count else None
    return wait_until(read)


def test_a_slow_shadow_gets_a_copy_and_costs_the_request_nothing(build_dir, tmp_path, up):
    shadow = Shadow(delay=2.0)
    gw, log = mirror_gateway(build_dir, tmp_path, up, f"127.0.0.1:{shadow.port}")
    try:
        start = time.monotonic()
        status, _, body = request(gw, "POST", "/echo?x=1", body=b"order 42",
                                  headers={"Content-Type": "text/plain"})
        assert (status, body) == (200, b"order 42")
        for _ in range(4):
            assert request(gw, "GET", "/plaintext")[0] == 200
        assert time.monotonic() - start < 1.0  # the shadow takes 2 s per request
        assert wait_until(lambda: len(shadow.got) == 5, seconds=10)
        method, path, fields, copied = next(g for g in shadow.got if g[0] == "POST")
        # The request as it goes upstream: the route's edits and the proxy's fields included.
        assert (method, path, copied) == ("POST", "/echo?x=1", b"order 42")
        assert fields["x-env"] == "test" and fields["x-forwarded-for"] == "127.0.0.1"
        assert fields["content-type"] == "text/plain"
        assert mirror_marks(log, 5) == ["sent"] * 5
    finally:
        gw.stop()
        shadow.stop()


def test_copies_beyond_max_in_flight_are_dropped(build_dir, tmp_path, up):
    shadow = Shadow(delay=1.5)
    gw, log = mirror_gateway(build_dir, tmp_path, up, f"127.0.0.1:{shadow.port}",
                             settings=", max_in_flight: 2")
    try:
        for _ in range(5):
            assert request(gw, "GET", "/plaintext")[0] == 200
        assert mirror_marks(log, 5) == ["sent", "sent", "dropped", "dropped", "dropped"]
        time.sleep(2)
        assert len(shadow.got) == 2
        # Once they are back, copies go again.
        assert request(gw, "GET", "/plaintext")[0] == 200
        assert mirror_marks(log, 6)[5] == "sent"
    finally:
        gw.stop()
        shadow.stop()


def test_large_bodies_are_not_copied_and_a_dead_shadow_changes_nothing(build_dir, tmp_path, up):
    gw, log = mirror_gateway(build_dir, tmp_path, up, f"127.0.0.1:{free_port()}")
    try:
        big = b"x" * (100 * 1024)
        status, _, body = request(gw, "POST", "/echo", body=big)
        assert status == 200 and body == big
        assert request(gw, "GET", "/plaintext")[0] == 200  # its copy finds nobody
        assert mirror_marks(log, 2) == ["skipped", "sent"]
    finally:
        gw.stop()


def test_percent_0_mirrors_nothing(build_dir, tmp_path, up):
    shadow = Shadow()
    gw, log = mirror_gateway(build_dir, tmp_path, up, f"127.0.0.1:{shadow.port}",
                             settings=", percent: 0")
    try:
        for _ in range(5):
            assert request(gw, "GET", "/plaintext")[0] == 200
        assert mirror_marks(log, 5) == [None] * 5
        time.sleep(0.3)
        assert shadow.got == []
    finally:
        gw.stop()
        shadow.stop()


class TricklingUpstream(ScriptedUpstream):
    """Answers with a body of 100 bytes, one a second."""

    def __init__(self):
        self.seen = 0
        super().__init__()

    def handle(self, conn):
        try:
            if read_request_head(conn) is None:
                return
            self.seen += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            for _ in range(100):
                time.sleep(1)
                conn.sendall(b"x")
        except OSError:
            pass
        finally:
            conn.close()


def test_a_trickling_mirror_frees_its_slots_and_cannot_hold_a_shutdown(build_dir, tmp_path):
    main, mirror = RecordingUpstream(), TricklingUpstream()
    text = f"""
drain_timeout: 2s
servers:
  - {{listen: 127.0.0.1:0, access_log: off}}
routes:
  - name: m
    match: {{path_prefix: /}}
    middlewares: [{{mirror: {{service: copy, max_in_flight: 1, timeout: 1s}}}}]
    service: main
services:
  main: {{url: "http://127.0.0.1:{main.port}"}}
  copy: {{url: "http://127.0.0.1:{mirror.port}"}}
"""
    server = gateway(build_dir, tmp_path, text, threads=1)
    try:
        assert request(server, "GET", "/one")[0] == 200
        time.sleep(3)  # the copy's deadline (1 s, each wait 1 s at most) has passed
        assert request(server, "GET", "/two")[0] == 200
        deadline = time.monotonic() + 3
        while mirror.seen < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mirror.seen == 2, "the first copy still held the only slot"
        started = time.monotonic()
        code = server.stop(signal.SIGTERM, timeout=20)
        took = time.monotonic() - started
        assert code == 0 and took < 6, (code, took)
    finally:
        server.stop()
        main.stop()
        mirror.stop()


# ---- mirror: a shadow that is slow, down or hostile ----------------------------------------


@pytest.mark.parametrize("kind", ["refuses", "stalls", "resets", "switches", "floods"])
def test_a_hostile_shadow_changes_nothing_the_primary_or_the_client_sees(
        build_dir, tmp_path, recorder, kind):
    held = None
    if kind == "refuses":
        held, port = held_dead_port()
        shadow, shadow_address = None, f"127.0.0.1:{port}"
    else:
        shadow = HostileShadow(kind)
        shadow_address = f"127.0.0.1:{shadow.port}"
    gw = gateway(build_dir, tmp_path, mirrored(recorder, shadow_address, ", max_in_flight: 2"),
                 threads=1)
    try:
        for i in range(6):
            body = bytes([65 + i]) * 60_000
            start = time.monotonic()
            status, _, answer = request(gw, "POST", f"/p{i}", body=body)
            assert status == 200 and time.monotonic() - start < 1.0, (kind, i, status)
            assert recorder.requests[-1][1] == body, (kind, i)
        assert recorder.targets() == [f"POST /p{i} HTTP/1.1" for i in range(6)]
    finally:
        gw.stop()
        if shadow:
            shadow.stop()
        if held:
            held.close()


class HeadFirst(ScriptedUpstream):
    """Notes when each request head arrives (before its body), then reads the body and
    answers."""

    def __init__(self):
        self.heads = []
        super().__init__()

    def handle(self, conn):
        with conn:
            got = read_request_head(conn)
            if got is None:
                return
            self.heads.append(time.monotonic())
            got = read_request(conn, got[0] + b"\r\n\r\n" + got[1])
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")


# (Before 75e2cbf the mirrored case failed: the copy read the body, the head reached the
# upstream only when the client's last byte came.)


@pytest.mark.parametrize("with_mirror", [False, True, "split"])
def test_a_mirror_never_makes_a_streamed_request_wait_for_its_body(build_dir, tmp_path,
                                                                    with_mirror):
    up = HeadFirst()
    shadow = HostileShadow("holds")
    text = mirrored(up, f"127.0.0.1:{shadow.port}", service_settings=", request_buffering: 0")
    if with_mirror == "split":
        # The route's service reads bodies whole; the traffic_split's pick streams them: the
        # copy must go by the service picked.
        text = text.replace("      - mirror:", "      - traffic_split: {services: [{service: a}]}"
                            "\n      - mirror:").replace("    service: a\n", "    service: b\n")
        text += f'  b: {{url: "http://{addr(up)}"}}\n'
    if not with_mirror:
        text = text.replace("    middlewares:\n      - mirror: {service: shadow, timeout: 1s}\n",
                            "")
    gw = gateway(build_dir, tmp_path, text)
    try:
        with socket.create_connection((gw.host, gw.port), timeout=5) as s:
            s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" +
                      b"x" * 10)
            assert wait_until(lambda: up.heads, seconds=2), "the head never went upstream"
            s.sendall(b"x" * 990)
            assert response_status(s) == 200
    finally:
        gw.stop()
        shadow.stop()
        up.stop()


def test_a_mirrored_expect_100_continue_gets_its_100_and_its_body_through(build_dir, tmp_path,
                                                                          recorder):
    shadow = HostileShadow("holds")
    gw = gateway(build_dir, tmp_path, mirrored(recorder, f"127.0.0.1:{shadow.port}"))
    try:
        with socket.create_connection((gw.host, gw.port), timeout=5) as s:
            s.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                      b"Expect: 100-continue\r\n\r\n")
            assert response_status(s) == 100
            s.sendall(b"hello")
            data = b""
            while b"\r\n\r\n" not in data.partition(b"\r\n\r\n")[2] and len(data) < 4096:
                more = s.recv(4096)
                if not more:
                    break
                data += more
                if b"200 OK" in data:
                    break
            assert b"HTTP/1.1 200" in data, data
        assert recorder.requests[-1][1] == b"hello"
    finally:
        gw.stop()
        shadow.stop()


def test_an_http2_body_of_unknown_length_is_not_copied_without_it(build_dir, tmp_path, recorder):
    got = []

    class Shadow(RecordingUpstream):
        def answer(self, head, body):
            got.append((head, body))
            return b"HTTP/1.1 204 No Content\r\n\r\n"
    shadow = Shadow()
    gw = gateway(build_dir, tmp_path, mirrored(recorder, f"127.0.0.1:{shadow.port}"))
    try:
        s, conn = h2_connect(gw)
        with s:
            conn.send_headers(1, request_headers("/h2", method="POST"))
            conn.send_data(1, b"q" * 100, end_stream=True)
            s.sendall(conn.data_to_send())
            events = h2_events_until(s, conn, lambda ev: any(
                isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) for e in ev))
        assert any(isinstance(e, h2.events.StreamEnded) for e in events), events
        assert recorder.requests[-1][1] == b"q" * 100
        time.sleep(0.3)
        # A copy, if there is one, carries the body whole.
        assert all(body == b"q" * 100 for _, body in got), got
    finally:
        gw.stop()
        shadow.stop()


def test_a_reload_that_drops_a_stalled_mirror_closes_its_connections(build_dir, tmp_path, up):
    from test_reload import Gateway
    shadow = HostileShadow("holds")
    text = mirrored(up, f"127.0.0.1:{shadow.port}")
    gw = Gateway(build_dir, tmp_path, text)
    try:
        for _ in range(6):
            assert request(gw.server, "GET", "/plaintext")[0] == 200
        assert wait_until(lambda: shadow.open >= 1)
        gw.sighup(text.replace("    middlewares:\n      - mirror: {service: shadow, timeout: 1s}\n",
                               "")
                  .replace(f'  shadow: {{url: "http://127.0.0.1:{shadow.port}"}}\n', ""))
        for _ in range(6):
            assert request(gw.server, "GET", "/plaintext")[0] == 200
        # Each copy ends within twice its timeout; then nothing of the old mirror is left.
        assert wait_until(lambda: shadow.open == 0, seconds=5), shadow.open
    finally:
        gw.stop()
        shadow.stop()


# ---- mirror with retries: one copy per request, whatever the primary's attempts -------------


def test_a_retried_request_is_copied_once(build_dir, tmp_path):
    got = []

    class Failing(RecordingUpstream):
        def answer(self, head, body):
            return b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"

    class Counting(RecordingUpstream):
        def answer(self, head, body):
            got.append(head)
            return b"HTTP/1.1 204 No Content\r\n\r\n"

    bad, good, shadow = Failing(), RecordingUpstream(), Counting()
    gw = gateway(build_dir, tmp_path, SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - mirror: {{service: shadow}}
    service: pool
services:
  pool: {{upstream: pool, retries: {{attempts: 2}}}}
  shadow: {{url: "http://127.0.0.1:{shadow.port}"}}
upstreams:
  pool:
    balancer: round_robin
    targets: [{{address: "127.0.0.1:{bad.port}"}}, {{address: "127.0.0.1:{good.port}"}}]
""", threads=1)
    try:
        for i in range(6):
            assert request(gw, "PUT", f"/r{i}", body=b"v")[0] == 200
        assert wait_until(lambda: len(got) >= 6)
        time.sleep(0.3)
        assert len(got) == 6, got
        assert len(bad.requests) >= 1
    finally:
        gw.stop()
        for u in (bad, good, shadow):
            u.stop()
