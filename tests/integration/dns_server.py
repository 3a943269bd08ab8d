"""An authoritative DNS server for the tests, on loopback (UDP and TCP on one port), answering
A, AAAA and SRV from a table the test changes while it runs, or failing as told: SERVFAIL,
REFUSED, NXDOMAIN, an empty answer, no answer at all (a timeout), a truncated UDP answer (the
TC bit: the whole answer over TCP only), or a reply that is not DNS. Every query is noted
(when, name, type, over what), so that a test can tell when and how often spindle asked.

Written by hand with struct (the few record types the tests need): python3-dnslib is not
among the suite's dependencies. Also the gateways of the DNS tests: `dns_gateway` (a
configuration whose `dns` asks the given servers), `upstream_body`, `answers`; the `dns`
fixture (conftest.py) is a DnsServer."""
import os
import socket
import struct
import threading
import time

from conftest import Server
from proxy_support import SERVER, request

A, AAAA, SRV = 1, 28, 33
OPT = 41
TYPE_NAMES = {A: "A", AAAA: "AAAA", SRV: "SRV"}

# What a rule may do instead of answering.
FAULTS = ("servfail", "refused", "nxdomain", "nodata", "silent", "truncate", "garbage")
RCODES = {"servfail": 2, "nxdomain": 3, "refused": 5}


class Rule:
    """How (name, type) is answered: `values` (A and AAAA: address text; SRV: (priority,
    weight, port, target); or a function giving them, called at each query) with `ttl`, or
    `fault` (one of FAULTS). "truncate" answers over UDP with the TC bit and no records, and
    with the records over TCP."""

    def __init__(self, values=(), ttl=1, fault=None):
        assert fault is None or fault in FAULTS, fault
        self.values = values if callable(values) else list(values)
        self.ttl = ttl
        self.fault = fault

    def records(self):
        return list(self.values()) if callable(self.values) else self.values


def encode_name(name):
    """A name in wire form; a label may be bytes (to send what no real zone holds)."""
    labels = name if isinstance(name, list) else [p for p in name.split(".") if p]
    out = b""
    for label in labels:
        raw = label if isinstance(label, bytes) else label.encode()
        out += bytes([len(raw)]) + raw
    return out + b"\0"


def _rdata(qtype, value):
    if qtype == A:
        return socket.inet_aton(value)
    if qtype == AAAA:
        return socket.inet_pton(socket.AF_INET6, value)
    priority, weight, port, target = value
    return struct.pack("!HHH", priority, weight, port) + encode_name(target)


class DnsServer:
    """Serves `self.rules`: {(name, type): Rule}. A name with no rule for the type asked gets
    an empty answer (NODATA) if it has a rule for another type, else NXDOMAIN. With `silent`
    set, nothing is answered. `queries`: (monotonic time, name, type, "udp"|"tcp")."""

    def __init__(self):
        self.rules = {}
        self.silent = False
        # With a number: negative answers carry an SOA record whose MINIMUM it is (RFC 2308).
        self.negative_ttl = None
        self.queries = []
        self.lock = threading.Lock()
        self.udp, self.tcp = self._bind()
        self.port = self.udp.getsockname()[1]
        self.running = True
        threading.Thread(target=self._serve_udp, daemon=True).start()
        threading.Thread(target=self._serve_tcp, daemon=True).start()

    @staticmethod
    def _bind():
        """A UDP and a TCP socket on one free port (the UDP one's, if TCP has it free)."""
        for _ in range(50):
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.bind(("127.0.0.1", 0))
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                tcp.bind(("127.0.0.1", udp.getsockname()[1]))
            except OSError:
                udp.close()
                tcp.close()
                continue
            tcp.listen(16)
            return udp, tcp
        raise RuntimeError("no port free for both UDP and TCP")

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def set(self, name, qtype, *values, ttl=1):
        """Answers (name, qtype) with `values` (or, given one function, what it returns)."""
        one_function = len(values) == 1 and callable(values[0])
        self.rules[(name, qtype)] = Rule(values[0] if one_function else values, ttl)

    def truncate(self, name, qtype, *values, ttl=1):
        """Answers (name, qtype) with `values` over TCP only (over UDP: the TC bit, no records)."""
        self.rules[(name, qtype)] = Rule(values, ttl, fault="truncate")

    def fail(self, name, qtype, fault):
        """Fails (name, qtype) as `fault` says (one of FAULTS)."""
        self.rules[(name, qtype)] = Rule(fault=fault)

    def asked(self, name=None, qtype=None, since=0.0):
        """The queries noted since `since` (monotonic), of `name` and `qtype` if given."""
        with self.lock:
            return [q for q in self.queries if q[0] >= since and (name is None or q[1] == name)
                    and (qtype is None or q[2] == qtype)]

    @staticmethod
    def _question(data):
        """(id, flags, name, qtype, the question's bytes, the UDP payload size it offers)."""
        ident, flags, qdcount, _, _, arcount = struct.unpack("!HHHHHH", data[:12])
        offset, labels = 12, []
        while data[offset]:
            n = data[offset]
            labels.append(data[offset + 1:offset + 1 + n].decode("latin-1"))
            offset += 1 + n
        qtype, _ = struct.unpack("!HH", data[offset + 1:offset + 5])
        end = offset + 5
        payload = 512
        # An EDNS OPT record (root name, type 41) offers a larger UDP payload in its class.
        if arcount and data[end:end + 1] == b"\0" and len(data) >= end + 5:
            rtype, rclass = struct.unpack("!HH", data[end + 1:end + 5])
            if rtype == OPT:
                payload = max(512, rclass)
        return ident, flags, ".".join(labels).lower(), qtype, data[12:end], payload

    def _answer(self, data, transport):
        """The reply to query `data`, or None (no answer)."""
        ident, flags, name, qtype, question, payload = self._question(data)
        with self.lock:
            self.queries.append((time.monotonic(), name, qtype, transport))
        if self.silent:
            return None
        rule = self.rules.get((name, qtype))
        fault = rule.fault if rule else None
        if fault == "silent":
            return None
        if fault == "garbage":
            return struct.pack("!H", ident) + b"\xff" * 9
        known = any(n == name for n, _ in self.rules)
        rcode = RCODES.get(fault, 0 if known else 3)
        truncated = fault == "truncate" and transport == "udp"
        records = []
        if rule and (fault is None or (fault == "truncate" and transport == "tcp")):
            for value in rule.records():
                rdata = _rdata(qtype, value)
                records.append(b"\xc0\x0c" + struct.pack("!HHIH", qtype, 1, rule.ttl, len(rdata)) +
                               rdata)
        # Too much for UDP: as a real server does, the records that fit and the TC bit.
        limit = payload if transport == "udp" else 65535
        body = question
        count = 0
        for record in records:
            if 12 + len(body) + len(record) > limit:
                truncated = True
                break
            body += record
            count += 1
        authority = 0
        if count == 0 and not truncated and rcode in (0, 3) and self.negative_ttl is not None:
            soa = (encode_name("ns.test") + encode_name("hostmaster.test") +
                   struct.pack("!IIIII", 1, 3600, 600, 86400, self.negative_ttl))
            body += b"\xc0\x0c" + struct.pack("!HHIH", 6, 1, 3600, len(soa)) + soa
            authority = 1
        bits = 0x8400 | (flags & 0x0100) | (0x0200 if truncated else 0) | rcode
        return struct.pack("!HHHHHH", ident, bits, 1, count, authority, 0) + body

    def _serve_udp(self):
        self.udp.settimeout(0.2)
        while self.running:
            try:
                data, peer = self.udp.recvfrom(4096)
            except OSError:
                continue
            try:
                reply = self._answer(data, "udp")
            except (IndexError, struct.error, UnicodeDecodeError):
                continue
            if reply is not None:
                self.udp.sendto(reply, peer)

    def _serve_tcp(self):
        self.tcp.settimeout(0.2)
        while self.running:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                continue
            threading.Thread(target=self._tcp_connection, args=(conn,), daemon=True).start()

    def _tcp_connection(self, conn):
        conn.settimeout(10)
        with conn:
            data = b""
            while self.running:
                try:
                    more = conn.recv(4096)
                except OSError:
                    return
                if not more:
                    return
                data += more
                while len(data) >= 2 and len(data) >= 2 + struct.unpack("!H", data[:2])[0]:
                    n = struct.unpack("!H", data[:2])[0]
                    query, data = data[2:2 + n], data[2 + n:]
                    reply = self._answer(query, "tcp")
                    if reply is not None:
                        conn.sendall(struct.pack("!H", len(reply)) + reply)

    def stop(self):
        self.running = False
        self.udp.close()
        self.tcp.close()


# ---- gateways that look their names up here -----------------------------------------------


def config_text(dns_servers, body, dns_keys=""):
    """A gateway's configuration: SERVER, `dns` asking `dns_servers` (min_ttl 1s), then `body`."""
    servers = ", ".join(f'"{s}"' for s in dns_servers)
    return SERVER + f"dns: {{servers: [{servers}], min_ttl: 1s{dns_keys}}}\n" + body


def dns_gateway(build_dir, tmp_path, dns_servers, body, dns_keys="", env=None):
    """spindle of one worker serving config_text(dns_servers, body, dns_keys)."""
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text(dns_servers, body, dns_keys))
    return Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                   "--threads", "1"], env=env)


def upstream_body(targets=None, srv=None, balancer="round_robin", health=""):
    """Routes, a service and its upstream `api`: `targets` (addresses) or `srv` (a name)."""
    where = (f"srv: {srv}" if srv else
             "targets: [" + ", ".join(f'{{address: "{t}"}}' for t in targets) + "]")
    return f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: api}}
services:
  api: {{upstream: api}}
upstreams:
  api:
    balancer: {balancer}
    {where}
{health}"""


def answers(gw, count=12):
    """`count` GETs of /: each answer's body (a Named server's name), or its status."""
    out = []
    for _ in range(count):
        status, _, body = request(gw, "GET", "/")
        out.append(body.decode() if status == 200 else status)
    return out
