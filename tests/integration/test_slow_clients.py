"""Clients that read slowly or not at all: pipelined requests never read hold bounded memory,
clients that take nothing cannot keep a target from the others, and an HTTP/2 client that reads
nothing holds up no other stream of an HTTP/2 upstream. Idle plain connections (a partial head,
a bare CRLF) count against max_connections_per_worker from their accept."""
import os
import socket
import time

import h2.events
import h2.settings
import pytest

from conftest import Server, memory_kib, san_env
from proxy_support import (addr, gateway, h2_connect, h2_events_until, request, request_headers,
                           spindle_bin, upstream, wait_until)
from test_tls_faults import closed_within


def test_pipelined_requests_that_are_never_read_hold_bounded_memory(build_dir, tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "small").write_bytes(b"s" * 16000)
    env = {"ASAN_OPTIONS": san_env("quarantine_size_mb=8:detect_leaks=0")}
    server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--listen",
                     "127.0.0.1:0", "--root", str(root), "--threads", "2"], env=env)
    socks = []
    try:
        assert request(server, "GET", "/small")[0] == 200
        before = memory_kib(server.proc.pid)
        burst = b"GET /small HTTP/1.1\r\nHost: a\r\n\r\n" * 640  # 20 KiB
        for _ in range(100):
            s = socket.create_connection((server.host, server.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(burst)
            socks.append(s)
        time.sleep(2)
        grown = (memory_kib(server.proc.pid) - before) // 1024
        print(f"RSS grew by {grown} MiB for 100 connections of 640 unread pipelined requests")
        assert grown < 64, grown
        # The server still answers others.
        assert request(server, "GET", "/small")[0] == 200
    finally:
        for s in socks:
            s.close()
        server.stop()


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


# ---- plain connections count from accept too ---------------------------------------------


@pytest.mark.parametrize("sends", [b"GET / HTTP/1.1\r\nHo", b"\r\n"], ids=["partial-head", "crlf"])
def test_idle_plain_connections_count_against_the_limit_from_accept(build_dir, tmp_path, sends):
    """(A client that sends nothing is not accepted yet: TCP_DEFER_ACCEPT keeps it in the
    kernel for the header timeout; one byte makes it a connection of ours.)"""
    config = tmp_path / "plain.yaml"
    config.write_text("""
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: off
    timeouts: {header: 10s, keepalive: 10s}
    limits: {max_connections_per_worker: 8}
""")
    server = Server([spindle_bin(build_dir), "serve", "--config", str(config), "--threads", "1"])
    held = []
    try:
        for _ in range(30):
            s = socket.create_connection((server.host, server.port), timeout=5)
            if sends:
                s.sendall(sends)
            held.append(s)
            time.sleep(0.01)
        closed = sum(closed_within(s, 0.1) for s in held)
        assert closed >= 22, f"only {closed} of 30 idle connections closed at once"
        for s in held:
            s.close()
        held = []
        assert wait_until(lambda: request(server, "GET", "/plaintext")[0] == 200, 5)
    finally:
        for s in held:
            s.close()
        assert server.stop() == 0
