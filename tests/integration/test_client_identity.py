"""The client's identity: one client address from every X-Forwarded-For line (and in any
spelling), an IPv4 client of a dual-stack listener named by its IPv4 address, and one rate
limit key per client whatever its port or spelling. (Rate limits that never fail open:
tests/unit/proxy/rate_limit_test.cc.)"""
import re
import socket

import pytest

from proxy_support import RecordingUpstream, gateway, pool_config, raw, request


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
    server = gateway(build_dir, tmp_path, pool_config([upstream], routes))
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
    body = pool_config([upstream], routes).replace("listen: 127.0.0.1:0", 'listen: "[::]:0"')
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
    server = gateway(build_dir, tmp_path, pool_config([upstream], routes))
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
