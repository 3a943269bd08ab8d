"""mirror: a copy of each request goes to another service, fire-and-forget. The copy carries
the request as it goes upstream (small bodies too), never slows the request (a shadow service
that takes seconds costs it nothing), is dropped beyond max_in_flight, and a shadow service that
is down changes nothing for the client; a trickling shadow frees its slots and cannot hold a
shutdown."""
import http.server
import json
import signal
import threading
import time

import pytest

from proxy_support import (SERVER, RecordingUpstream, ScriptedUpstream, addr, free_port, gateway,
                           read_request_head, request, wait_until)


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
