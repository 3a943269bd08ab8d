"""Picking a target: health that clients cannot spoil (slow uploads take no target out),
ejections capped and the panic threshold, and a canary rolled back to weight 0 that stays
rolled back, cookie or not."""
import re
import socket
import threading
import time

from proxy_support import (POOL_ROUTE, RecordingUpstream, ScriptedUpstream, free_port, gateway,
                           pool_config, read_request, read_request_head, request)


class ImpatientUpstream(ScriptedUpstream):
    """An upstream with a 0.5 s read deadline (as Go's ReadTimeout): a request whose body stalls
    longer is cut off. Whole requests are answered 200."""

    def handle(self, conn):
        conn.settimeout(0.5)
        try:
            while True:
                got = read_request(conn)
                if got is None:
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass  # the deadline passed: the connection is closed, as such servers do
        finally:
            conn.close()


def slow_upload(server):
    """A POST of 200 KiB (beyond request_buffering) that stops half way, for 1.5 s."""
    with socket.create_connection((server.host, server.port), timeout=10) as s:
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 204800\r\n\r\n"
                  + b"x" * 102400)
        time.sleep(1.5)
        try:
            s.sendall(b"x" * 102400)
            s.recv(4096)
        except OSError:
            pass


def test_slow_uploads_do_not_take_the_targets_out(build_dir, tmp_path):
    targets = [ImpatientUpstream(), ImpatientUpstream()]
    server = gateway(build_dir, tmp_path, pool_config(targets, POOL_ROUTE))
    try:
        threads = [threading.Thread(target=slow_upload, args=(server,)) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = [request(server, "GET", "/after")[0] for _ in range(10)]
        assert statuses == [200] * 10, statuses
    finally:
        server.stop()
        for t in targets:
            t.stop()


class ClosingUpstream(ScriptedUpstream):
    """Closes every connection as soon as a request head arrives."""

    def handle(self, conn):
        read_request_head(conn)
        conn.close()


def metric(server_text, name):
    found = re.search(rf"(?m)^{name}{{service=\"s\"}} (\S+)$", server_text)
    return float(found.group(1)) if found else 0.0


def test_ejections_are_capped_and_below_the_panic_threshold_every_target_serves(build_dir,
                                                                               tmp_path):
    bad = [ClosingUpstream() for _ in range(3)]
    good = RecordingUpstream()
    admin = free_port()
    text = pool_config(bad + [good], POOL_ROUTE,
                  services_extra=", retries: {attempts: 1}",
                  upstream_extra="    health: {passive: {max_fails: 1, max_ejection_percent: 50}}")
    server = gateway(build_dir, tmp_path, text + f"admin: {{listen: 127.0.0.1:{admin}}}\n")
    try:
        for _ in range(40):
            request(server, "GET", "/")
        with socket.create_connection(("127.0.0.1", admin), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            shown = b""
            while chunk := s.recv(65536):
                shown += chunk
        shown = shown.decode()
        # 50% of 4: two out at most; the third failing target stays in.
        assert metric(shown, "spindle_upstream_ejections_total") >= 2, shown
        assert metric(shown, "spindle_upstream_ejections_withheld_total") >= 1, shown
        # The good target kept serving all along.
        assert len(good.requests) > 0
    finally:
        server.stop()
        good.stop()
        for b in bad:
            b.stop()


class CountingClosingUpstream(ClosingUpstream):
    def __init__(self):
        self.seen = 0
        super().__init__()

    def handle(self, conn):
        self.seen += 1
        super().handle(conn)


def test_below_the_panic_threshold_the_balancer_spreads_over_every_target(build_dir, tmp_path):
    bad, good = CountingClosingUpstream(), RecordingUpstream()
    admin = free_port()
    text = pool_config([bad, good], POOL_ROUTE, services_extra=", retries: {attempts: 1}",
                  upstream_extra="    health: {passive: {max_fails: 1, max_ejection_percent: 50},"
                                 " panic_threshold: 60}")
    server = gateway(build_dir, tmp_path, text + f"admin: {{listen: 127.0.0.1:{admin}}}\n",
                     threads=1)
    try:
        for _ in range(20):
            request(server, "GET", "/")
        # One of two out is 50% healthy, below 60%: the ejected target is still sent requests.
        assert bad.seen > 2, bad.seen
        with socket.create_connection(("127.0.0.1", admin), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            shown = b""
            while chunk := s.recv(65536):
                shown += chunk
        assert metric(shown.decode(), "spindle_upstream_panic_total") > 0
    finally:
        server.stop()
        bad.stop()
        good.stop()


def test_a_canary_at_weight_zero_serves_nobody_cookie_or_not(build_dir, tmp_path):
    stable, canary = RecordingUpstream(), RecordingUpstream()
    text = f"""
servers:
  - {{listen: 127.0.0.1:0, access_log: off}}
routes:
  - name: split
    match: {{path_prefix: /}}
    middlewares:
      - traffic_split:
          sticky_cookie: track
          services: [{{service: stable, weight: 1}}, {{service: canary, weight: 0}}]
    service: stable
services:
  stable: {{url: "http://127.0.0.1:{stable.port}"}}
  canary: {{url: "http://127.0.0.1:{canary.port}"}}
"""
    server = gateway(build_dir, tmp_path, text)
    try:
        for _ in range(5):
            status, fields, _ = request(server, "GET", "/", headers={"Cookie": "track=canary"})
            assert status == 200
            assert fields["Set-Cookie"].startswith("track=stable"), fields
        assert canary.requests == []
        assert len(stable.requests) == 5
    finally:
        server.stop()
        stable.stop()
        canary.stop()
