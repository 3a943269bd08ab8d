"""TLS settings belong to the service that declared them: two services sharing an upstream are
each spoken for with their own (verification, CA, server name), in either order; a reload that
keeps a service's settings keeps its upstream connections and its targets' health, and one that
changes them closes the connections made with the old ones."""
import http.client
import os
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

from conftest import Server
from proxy_support import free_port, held_dead_port, logged, request, wait_until


class TlsUpstream:
    """An HTTPS upstream written in the test: answers every request 200 with its name, and
    records what each connection's handshake asked for (SNI: `names`, None for no name), the
    connections accepted (`accepted`) and those that ended (`closed`)."""

    def __init__(self, name, cert, key):
        self.name = name.encode()
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.ctx.set_alpn_protocols(["http/1.1"])
        self.names = []
        self.ctx.sni_callback = lambda sock, name, ctx: self.names.append(name)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.closed = 0
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        conn.settimeout(30)
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):
            conn.close()  # a client that refused our certificate
            return
        self.accepted += 1
        data = b""
        try:
            while True:
                while b"\r\n\r\n" not in data:
                    more = tls.recv(65536)
                    if not more:
                        return
                    data += more
                _, _, data = data.partition(b"\r\n\r\n")
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Upstream: %s\r\n\r\n%s"
                            % (len(self.name), self.name, self.name))
        except (OSError, ssl.SSLError):
            return
        finally:
            self.closed += 1
            tls.close()

    def stop(self):
        self.running = False
        self.sock.close()


def self_signed(tmp_path):
    """A certificate for localhost and 127.0.0.1 that no CA signed (an impostor's)."""
    cert, key = tmp_path / "impostor.pem", tmp_path / "impostor.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def shared_upstream_config(port, upstream_port, certs, strict_first):
    lax = "  lax: {upstream: pool, tls: {verify: false}}\n"
    strict = f"  strict: {{upstream: pool, tls: {{ca: {certs}/ca.pem, server_name: localhost}}}}\n"
    return f"""
servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: lax, match: {{path_prefix: /lax/}}, service: lax}}
  - {{name: strict, match: {{path_prefix: /strict/}}, service: strict}}
services:
{strict + lax if strict_first else lax + strict}
upstreams:
  pool: {{targets: [{{address: 127.0.0.1:{upstream_port}}}]}}
"""


def serve(build_dir, tmp_path, text, threads=2):
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    checked = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config", str(path)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    return Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                   "--threads", str(threads)]), path


@pytest.mark.parametrize("strict_first", [False, True], ids=["lax-first", "strict-first"])
def test_services_sharing_an_upstream_each_use_their_own_tls_settings(build_dir, tmp_path, certs,
                                                                       strict_first):
    impostor = TlsUpstream("impostor", *self_signed(tmp_path))
    real = TlsUpstream("real", f"{certs}/localhost.pem", f"{certs}/localhost.key")
    try:
        for target in (impostor, real):
            gw, _ = serve(build_dir, tmp_path,
                          shared_upstream_config(free_port(), target.port, certs, strict_first),
                          threads=1)
            try:
                # Each service in turn, twice (the second on a pooled connection, if any).
                for _ in range(2):
                    status, headers, _ = request(gw, "GET", "/lax/x")
                    assert (status, headers.get("x-upstream")) == (200, target.name.decode())
                    status, headers, body = request(gw, "GET", "/strict/x")
                    if target is impostor:
                        # Verified: the impostor's certificate is refused, never answered for.
                        assert status == 502 and headers.get("x-upstream") is None, body
                    else:
                        assert (status, headers.get("x-upstream")) == (200, "real")
                if target is impostor:
                    assert logged(gw, "route strict", "certificate"), gw.errors
                else:
                    # One connection each: the strict one sent SNI, the lax one (to an address,
                    # without a server_name) none; neither used the other's.
                    assert real.accepted == 2
                    assert sorted(real.names, key=str) == [None, "localhost"]
            finally:
                assert gw.stop() == 0
    finally:
        impostor.stop()
        real.stop()


def established_to(port):
    """Established TCP connections to 127.0.0.1:`port` on this machine (from /proc/net/tcp)."""
    count = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if state == "01" and int(remote.split(":")[1], 16) == port:
                count += 1
    return count


def metric(admin_port, name, **labels):
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.split()[-1])
    return None


def reload_config(admin_port, port, real_port, dead_port, certs, route, tls_extra=""):
    return f"""
admin: {{listen: 127.0.0.1:{admin_port}}}
servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: {route}, match: {{path_prefix: /}}, service: s}}
services:
  s: {{upstream: pool, retries: {{attempts: 2, budget: 100%}}, tls: {{ca: {certs}/ca.pem{tls_extra}}}}}
upstreams:
  pool:
    balancer: round_robin
    targets: [{{address: "127.0.0.1:{real_port}"}}, {{address: "127.0.0.1:{dead_port}"}}]
    health: {{passive: {{max_fails: 1, fail_timeout: 60s}}}}
"""


def sighup(gw, path, text):
    path.write_text(text)
    before = len(gw.errors)
    gw.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: any("reload (SIGHUP)" in line and "in force" in line
                                  for line in gw.errors[before:])), gw.errors[before:]


def test_a_reload_keeps_tls_connections_and_health_and_closes_the_pools_it_drops(
        build_dir, tmp_path, certs):
    real = TlsUpstream("real", f"{certs}/localhost.pem", f"{certs}/localhost.key")
    dead, dead_port = held_dead_port()
    admin_port, port = free_port(), free_port()
    text = lambda route, extra="": reload_config(admin_port, port, real.port, dead_port, certs,
                                                 route, extra)
    gw, path = serve(build_dir, tmp_path, text("first"), threads=1)
    dead_target = f"127.0.0.1:{dead_port}"
    try:
        # The dead target fails once and is out for a minute (the request goes on to the other).
        for _ in range(4):
            assert request(gw, "GET", "/x")[0] == 200
        assert metric(admin_port, "spindle_upstream_target_healthy", upstream="pool",
                      target=dead_target) == 0
        assert real.accepted == 1
        # Reloads that keep the service's TLS settings (the route's name changes: a new
        # configuration, new client contexts of the same settings) keep both.
        for route in ("second", "third", "fourth"):
            sighup(gw, path, text(route))
            for _ in range(4):
                assert request(gw, "GET", "/x")[0] == 200
            assert real.accepted == 1, "a reload opened a new upstream connection"
            assert metric(admin_port, "spindle_upstream_target_healthy", upstream="pool",
                          target=dead_target) == 0, "a reload forgot the target's health"
        assert established_to(real.port) == 1
        # New TLS settings (a server name): new connections, and the old one is closed.
        sighup(gw, path, text("fifth", ", server_name: localhost"))
        assert request(gw, "GET", "/x")[0] == 200
        assert real.accepted == 2
        assert wait_until(lambda: real.closed >= 1), "the pool no longer named kept its socket"
        assert wait_until(lambda: established_to(real.port) == 1)
    finally:
        assert gw.stop() == 0
        dead.close()
        real.stop()


def test_an_http2_pool_no_longer_named_closes_once_its_streams_end(build_dir, tmp_path, certs):
    from proxy_support import upstream
    # (It keeps idle connections a minute: only the gateway closes them here.)
    up = upstream(build_dir, "h2", keepalive_ms=60_000,
                  tls=(f"{certs}/localhost.pem", f"{certs}/localhost.key"))
    port = free_port()
    text = lambda extra: f"""
servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: r, match: {{path_prefix: /}}, service: s}}
services:
  s: {{url: "https://127.0.0.1:{up.port}", protocol: h2, tls: {{ca: {certs}/ca.pem{extra}}}}}
"""
    gw, path = serve(build_dir, tmp_path, text(""), threads=1)
    try:
        assert request(gw, "GET", "/plaintext")[0] == 200
        assert established_to(up.port) == 1
        # A stream in flight on the old pool's connection across the reload...
        slow = {}
        t = threading.Thread(target=lambda: slow.update(r=request(gw, "GET", "/delay/1500")))
        t.start()
        time.sleep(0.3)
        sighup(gw, path, text(", server_name: localhost"))  # new TLS settings: a new pool
        assert request(gw, "GET", "/plaintext")[0] == 200
        assert established_to(up.port) == 2  # the old one still carries the slow stream
        t.join(10)
        # ...finishes, and then its connection closes.
        assert slow["r"][0] == 200
        assert wait_until(lambda: established_to(up.port) == 1), established_to(up.port)
    finally:
        assert gw.stop() == 0
        up.stop()
