"""The gateway under attack keeps its promises: the client's identity from every X-Forwarded-For
line (and in any spelling), health that clients cannot spoil, a rolled-back canary that stays
rolled back, mirrors that cannot hold a shutdown, and no replay of a POST that may have reached
an upstream. (Rate limits that never fail open: tests/unit/proxy/rate_limit_test.cc.)"""
import re
import signal
import socket
import struct
import threading
import time

import pytest

import h2.settings

from proxy_support import (RecordingUpstream, ScriptedUpstream, addr, gateway, h2_connect,
                           h2_events_until, raw, read_request, read_request_head, request,
                           request_headers, upstream)


def config(targets, routes, servers_extra="", services_extra="", upstream_extra=""):
    target_list = ", ".join(f"{{address: '127.0.0.1:{t.port}'}}" for t in targets)
    return f"""
servers:
  - listen: 127.0.0.1:0
    access_log: off
    trusted_proxies: [127.0.0.1]
{servers_extra}
routes:
{routes}
services:
  s: {{upstream: u{services_extra}}}
upstreams:
  u:
    targets: [{target_list}]
{upstream_extra}
"""


ROUTE = "  - {name: all, match: {path_prefix: /}, service: s}\n"


# ---- 1 and 4: the client's address -------------------------------------------------------------


def test_every_x_forwarded_for_line_counts_and_entries_are_addresses_in_any_spelling(
        build_dir, tmp_path):
    upstream = RecordingUpstream()
    routes = """  - name: allow
    match: {path_prefix: /internal}
    middlewares: [{ip_allow: [10.0.0.0/8]}]
    service: s
  - name: deny
    match: {path_prefix: /public}
    middlewares: [{ip_deny: [203.0.113.0/24, "2001:db8::/32"]}]
    service: s
"""
    server = gateway(build_dir, tmp_path, config([upstream], routes))
    try:
        def status(path, *lines):
            fields = "".join(f"X-Forwarded-For: {v}\r\n" for v in lines)
            got = raw(server, (f"GET {path} HTTP/1.1\r\nHost: a\r\n{fields}Connection: close"
                               "\r\n\r\n").encode(), wait=3)
            return int(got.split(b" ", 2)[1])

        # A proxy in front (haproxy's option forwardfor) added its own line: the client's own
        # claim of 10.1.2.3 is on the first line, its real address on the last.
        assert status("/internal", "10.1.2.3", "203.0.113.9") == 403
        assert upstream.targets() == []
        assert status("/internal", "10.1.2.3") == 200
        # What goes upstream: the client and the trusted hops, canonical; not the claims left
        # of the client.
        head = upstream.requests[-1][0].decode()
        assert re.findall(r"(?im)^x-forwarded-for: ([^\r]*)", head) == ["10.1.2.3, 127.0.0.1"]
        # Entries with ports, bracketed and mapped IPv6, other spellings of one address.
        for entry in ["203.0.113.7:40001", "[::ffff:203.0.113.7]:1", "::ffff:203.0.113.7",
                      "2001:0db8:0:0::1", "[2001:db8::1]:443"]:
            assert status("/public", entry) == 403, entry
        assert status("/public", "198.51.100.1:80") == 200
        # An entry that is not an address stops the walk: the trusted peer that passed it on is
        # the client (it is not in 10/8).
        assert status("/internal", "10.1.2.3, unknown") == 403
    finally:
        server.stop()
        upstream.stop()


def test_an_ipv4_client_of_a_dual_stack_listener_is_named_by_its_ipv4_address(build_dir, tmp_path):
    # Through a listener on [::], an IPv4 client's peer address is IPv4-mapped
    # (::ffff:127.0.0.1): X-Forwarded-For and ip_allow name it 127.0.0.1 all the same.
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::", 0))
    except OSError as e:
        pytest.skip(f"no IPv6 on this machine: {e}")
    upstream = RecordingUpstream()
    routes = """  - name: allow
    match: {path_prefix: /}
    middlewares: [{ip_allow: ["127.0.0.1/32"]}]
    service: s
"""
    body = config([upstream], routes).replace("listen: 127.0.0.1:0", 'listen: "[::]:0"')
    body = body.replace("    trusted_proxies: [127.0.0.1]\n", "")  # the peer is the client
    server = gateway(build_dir, tmp_path, body)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET /mapped HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 10.9.9.9\r\n"
                         b"Connection: close\r\n\r\n")
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply
        head = upstream.requests[-1][0].decode()
        assert re.findall(r"(?im)^x-forwarded-for: ([^\r]*)", head) == ["127.0.0.1"], head
    finally:
        server.stop()
        upstream.stop()


def test_one_client_is_one_rate_limit_key_whatever_the_port_or_spelling(build_dir, tmp_path):
    upstream = RecordingUpstream()
    routes = """  - name: limited
    match: {path_prefix: /}
    middlewares: [{rate_limit: {key: client_ip, rate: 1/m, burst: 2}}]
    service: s
"""
    server = gateway(build_dir, tmp_path, config([upstream], routes))
    try:
        got = [request(server, "GET", "/", headers={"X-Forwarded-For": f"203.0.113.7:{4000 + i}"})[0]
               for i in range(4)]
        assert got == [200, 200, 429, 429], got
        got = [request(server, "GET", "/", headers={"X-Forwarded-For": spelling})[0]
               for spelling in ("2001:db8::5", "2001:0db8::0005", "[2001:db8:0:0:0:0:0:5]:9")]
        assert got == [200, 200, 429], got
    finally:
        server.stop()
        upstream.stop()


# ---- 3: health that clients cannot spoil --------------------------------------------------------


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
    server = gateway(build_dir, tmp_path, config(targets, ROUTE))
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
    from proxy_support import free_port
    bad = [ClosingUpstream() for _ in range(3)]
    good = RecordingUpstream()
    admin = free_port()
    text = config(bad + [good], ROUTE,
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
    from proxy_support import free_port
    bad, good = CountingClosingUpstream(), RecordingUpstream()
    admin = free_port()
    text = config([bad, good], ROUTE, services_extra=", retries: {attempts: 1}",
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


# ---- 5: a rolled-back canary ---------------------------------------------------------------------


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


# ---- 6: a trickling mirror -------------------------------------------------------------------------


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


# ---- 7: a POST whose first write failed part-way -----------------------------------------------


class ResettingUpstream(ScriptedUpstream):
    """Reads a little of a request, then resets the connection (never reading the rest)."""

    def __init__(self):
        self.seen = 0
        super().__init__()

    def handle(self, conn):
        conn.recv(1024)
        self.seen += 1
        time.sleep(0.3)  # the gateway's socket buffers fill meanwhile
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()


def test_a_post_that_may_have_reached_an_upstream_is_never_sent_again(build_dir, tmp_path):
    first, second = ResettingUpstream(), RecordingUpstream()
    text = config([first, second], ROUTE, servers_extra="    limits: {max_body: 64m}",
                  services_extra=", request_buffering: 16m",
                  upstream_extra="    balancer: round_robin")
    server = gateway(build_dir, tmp_path, text, threads=1)
    try:
        body = b"p" * (12 << 20)  # more than the kernel takes at once on loopback
        statuses = []
        while first.seen == 0 and len(statuses) < 6:  # round robin reaches `first` soon
            statuses.append(request(server, "POST", "/pay", body=body, timeout=30)[0])
        assert first.seen == 1
        posts = [h for h, _ in second.requests if h.startswith(b"POST")]
        # Each POST went to one target only: the one `first` cut part-way is a 502, not a
        # second POST to `second`.
        assert statuses[-1] == 502, statuses
        assert len(posts) == len(statuses) - 1, (statuses, len(posts))
    finally:
        server.stop()
        first.stop()
        second.stop()


# ---- clients that take nothing -----------------------------------------------------------------


@pytest.mark.parametrize("preempt, victim_status", [("300ms", 200), ("0s", 503)])
def test_clients_that_take_nothing_cannot_keep_a_target_from_the_others(
        build_dir, tmp_path, preempt, victim_status):
    # One HTTP/2 connection that never opens its streams' windows asks for ten large answers:
    # the gateway relays nothing to it, so each exchange holds its upstream connection (the
    # answers are larger than the kernel's buffers hold). With four connections allowed, a
    # victim's request waits its turn: an exchange left alone past preempt_stalled gives its
    # connection to it (the victim is answered); with preemption off it waits out the connect
    # timeout and gets 503 (the attack this guards against).
    target = upstream(build_dir, "a")
    server = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, access_log: off, http2: true}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: s}}
services:
  s: {{upstream: u, timeouts: {{connect: 3s}}, retries: {{attempts: 1}}}}
upstreams:
  u:
    targets: [{{address: "{addr(target)}"}}]
    limits: {{max_connections: 4, preempt_stalled: {preempt}}}
""", threads=1)
    s = None
    try:
        s, conn = h2_connect(server)
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        for i in range(10):
            conn.send_headers(1 + 2 * i, request_headers("/bytes/16000000"), end_stream=True)
        s.sendall(conn.data_to_send())
        # Heads back for the four that got a connection; their bodies wait for a window.
        events = h2_events_until(
            s, conn, lambda ev: sum(isinstance(e, h2.events.ResponseReceived) for e in ev) >= 4)
        assert sum(isinstance(e, h2.events.ResponseReceived) for e in events) >= 4, events
        time.sleep(0.5)  # left alone past the 300 ms
        started = time.monotonic()
        status = request(server, "GET", "/plaintext")[0]
        waited = time.monotonic() - started
        assert status == victim_status
        if victim_status == 200:
            assert waited < 2.5, waited
        else:
            assert waited >= 2.5, waited
    finally:
        if s is not None:
            s.close()
        server.stop()
        target.stop()



def test_a_client_that_reads_nothing_holds_up_no_other_stream_of_an_http2_upstream(
        build_dir, tmp_path):
    # One HTTP/2 connection with its windows at 0 asks for 80 large answers from an HTTP/2
    # upstream: 80 streams of one upstream connection whose bytes nobody reads, each stream's
    # window (256 KiB) full, 20 MiB in all, more than the connection's 16 MiB window. A victim's
    # request goes on the same connection and is answered at once: the connection's window
    # reopens as bytes arrive. (Given back only as callers read, it stayed shut and the victim
    # got 502 after the read timeout.)
    target = upstream(build_dir, "a")
    server = gateway(build_dir, tmp_path, f"""
servers:
  - {{listen: 127.0.0.1:0, access_log: off, http2: true}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: s}}
services:
  s: {{url: "http://{addr(target)}", protocol: h2c, timeouts: {{read: 4s}}, retries: {{attempts: 1}}}}
""", threads=1)
    s = None
    try:
        s, conn = h2_connect(server)
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        for i in range(80):
            conn.send_headers(1 + 2 * i, request_headers("/bytes/1000000"), end_stream=True)
        s.sendall(conn.data_to_send())
        events = h2_events_until(
            s, conn, lambda ev: sum(isinstance(e, h2.events.ResponseReceived) for e in ev) >= 80)
        assert sum(isinstance(e, h2.events.ResponseReceived) for e in events) == 80, events
        time.sleep(0.5)  # the upstream sends what the windows let it
        started = time.monotonic()
        status, _, body = request(server, "GET", "/plaintext", timeout=8)
        assert (status, body) == (200, b"Hello, World!")
        assert time.monotonic() - started < 2, "the victim waited on the attacker's streams"
    finally:
        if s is not None:
            s.close()
        server.stop()
        target.stop()
