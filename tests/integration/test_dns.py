"""DNS discovery against a small DNS server of the test's own on loopback (UDP; A, AAAA and SRV
from a table the test changes): a target name is looked up again on its TTL and traffic
follows its addresses; SRV records give targets, ports and weights; a name that disappears
takes its target out, one that appears brings it in; a DNS server that stops answering keeps
the last answer."""
import http.server
import socket
import struct
import threading
import time

import pytest

from proxy_support import SERVER, config_error, gateway, logged, request, wait_until

A, AAAA, SRV = 1, 28, 33


class DnsServer:
    """Answers A / AAAA / SRV queries from `records`: {(name, type): [value, ...]}, where an A
    value is an IPv4 text and an SRV value (priority, weight, port, target). TTL `ttl`. Names
    it does not know get NXDOMAIN; with `silent` set it answers nothing."""

    def __init__(self, ttl=1):
        self.records = {}
        self.ttl = ttl
        self.silent = False
        self.queries = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.running = True
        threading.Thread(target=self._serve, daemon=True).start()

    @staticmethod
    def _name(data, offset):
        labels = []
        while data[offset]:
            n = data[offset]
            labels.append(data[offset + 1:offset + 1 + n].decode())
            offset += 1 + n
        return ".".join(labels).lower(), offset + 1

    @staticmethod
    def _encode(name):
        return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p) + b"\0"

    def _serve(self):
        self.sock.settimeout(0.2)
        while self.running:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                continue
            self.queries += 1
            if self.silent:
                continue
            ident, flags = struct.unpack("!HH", data[:4])
            name, end = self._name(data, 12)
            qtype, _ = struct.unpack("!HH", data[end:end + 4])
            question = data[12:end + 4]
            known = any(n == name for n, _ in self.records)
            answers = b""
            values = self.records.get((name, qtype), [])
            for value in values:
                if qtype == A:
                    rdata = socket.inet_aton(value)
                elif qtype == AAAA:
                    rdata = socket.inet_pton(socket.AF_INET6, value)
                else:
                    priority, weight, port, target = value
                    rdata = struct.pack("!HHH", priority, weight, port) + self._encode(target)
                answers += (b"\xc0\x0c" + struct.pack("!HHIH", qtype, 1, self.ttl, len(rdata)) +
                            rdata)
            rcode = 0 if known else 3
            header = struct.pack("!HHHHHH", ident, 0x8180 | rcode, 1, len(values), 0, 0)
            self.sock.sendto(header + question + answers, peer)

    def stop(self):
        self.running = False
        self.sock.close()


class Named:
    """An HTTP server on `host` answering its `name` to every GET."""

    def __init__(self, host, name, port=0):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                body = name.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def answers(gw, count=12):
    return [request(gw, "GET", "/")[2].decode() for _ in range(count)]


@pytest.fixture
def dns():
    server = DnsServer(ttl=1)
    yield server
    server.stop()


def test_traffic_follows_a_names_addresses_within_its_ttl(build_dir, tmp_path, dns):
    # Three upstreams on one port, on three loopback addresses.
    one = Named("127.0.0.2", "one")
    two = Named("127.0.0.3", "two", one.port)
    three = Named("127.0.0.4", "three", one.port)
    dns.records[("api.test", A)] = ["127.0.0.2"]
    gw = gateway(build_dir, tmp_path, SERVER + f"""
dns: {{servers: ["127.0.0.1:{dns.port}"], min_ttl: 1s, timeout: 300ms}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: api}}
services:
  api: {{upstream: api}}
upstreams:
  api:
    targets: [{{address: "api.test:{one.port}"}}]
""")
    try:
        assert set(answers(gw)) == {"one"}
        # Two addresses: both targets get traffic (round robin).
        dns.records[("api.test", A)] = ["127.0.0.3", "127.0.0.4"]
        assert wait_until(lambda: set(answers(gw)) == {"two", "three"}, seconds=6)
        assert logged(gw, "dns: upstream api now has 2 target(s)")
        # The DNS server stops answering: the last answer stays.
        dns.silent = True
        time.sleep(3)
        assert set(answers(gw)) == {"two", "three"}
        dns.silent = False
        # The name is gone (NXDOMAIN): no target, 503; back: traffic again.
        dns.records.clear()
        assert wait_until(lambda: request(gw, "GET", "/")[0] == 503, seconds=6)
        dns.records[("api.test", A)] = ["127.0.0.2"]
        assert wait_until(lambda: set(answers(gw)) == {"one"}, seconds=6)
    finally:
        gw.stop()
        for s in (one, two, three):
            s.stop()


def test_srv_records_give_targets_ports_and_weights(build_dir, tmp_path, dns):
    a = Named("127.0.0.2", "a")
    b = Named("127.0.0.3", "b")
    c = Named("127.0.0.4", "c")
    srv = "_http._tcp.api.test"
    dns.records[(srv, SRV)] = [(10, 3, a.port, "a.api.test"), (10, 1, b.port, "b.api.test"),
                               (20, 1, c.port, "c.api.test")]  # a fallback priority: unused
    dns.records[("a.api.test", A)] = ["127.0.0.2"]
    dns.records[("b.api.test", A)] = ["127.0.0.3"]
    dns.records[("c.api.test", A)] = ["127.0.0.4"]
    gw = gateway(build_dir, tmp_path, SERVER + f"""
dns: {{servers: ["127.0.0.1:{dns.port}"], srv_refresh: 1s}}
routes:
  - {{name: all, match: {{path_prefix: /}}, service: api}}
services:
  api: {{upstream: api}}
upstreams:
  api:
    balancer: weighted
    srv: {srv}
""", threads=1)  # one worker: one balancer, so the shares are exact
    try:
        got = answers(gw, 40)
        assert got.count("a") == 30 and got.count("b") == 10, got  # weights 3:1
        # b leaves the SRV set, c comes in at the first priority.
        dns.records[(srv, SRV)] = [(10, 1, a.port, "a.api.test"), (10, 1, c.port, "c.api.test")]
        assert wait_until(lambda: set(answers(gw)) == {"a", "c"}, seconds=6)
    finally:
        gw.stop()
        for s in (a, b, c):
            s.stop()


def test_bad_dns_settings_are_configuration_errors(build_dir, tmp_path):
    for section, why in [
        ("dns: {servers: [nowhere]}", "dns.servers: 'nowhere' is not IPv4:PORT"),
        ("dns: {min_ttl: 10s, max_ttl: 1s}", "dns.max_ttl: must be at least min_ttl"),
    ]:
        config = tmp_path / "bad.yaml"
        config.write_text(f"servers:\n  - {{listen: 127.0.0.1:0}}\n{section}\n")
        err = config_error(build_dir, config)
        assert f"{config}:3: {why}" in err, err
