"""TLS settings belong to the service that declared them: two services sharing an upstream are
each spoken for with their own (verification, CA, server name), in either order; a reload that
keeps a service's settings keeps its upstream connections and its targets' health, and one that
changes them closes the connections made with the old ones. Across reloads that reorder, add
and drop the services sharing an upstream (HTTP/1.1 and h2c), each keeps its own settings and one
service's TLS failures count against the target for its own settings only; an upstream TLS
handshake, stalled or trickled, is bounded by the connect timeout as a whole."""
import os
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

from conftest import Server
from proxy_support import (fds, free_port, held_dead_port, logged, metric, reload_and_wait, request,
                           serve_file, upstream, wait_until)


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


# ---- TLS settings per service, in every order and across reloads ------------------------------


def shared(port, upstream_port, certs, order, health="", admin=None, generation=0):
    """Services `order` (a list of lax/strict/strict2) sharing upstream pool."""
    declared = {
        "lax": "  lax: {upstream: pool, retries: {attempts: 1}, tls: {verify: false}}\n",
        "strict": f"  strict: {{upstream: pool, retries: {{attempts: 1}}, "
                  f"tls: {{ca: {certs}/ca.pem, server_name: localhost}}}}\n",
        # The same CA, no server name: a third set of settings.
        "strict2": f"  strict2: {{upstream: pool, retries: {{attempts: 1}}, "
                   f"tls: {{ca: {certs}/ca.pem}}}}\n",
    }
    routes = "".join(f"  - {{name: {s}, match: {{path_prefix: /{s}/}}, service: {s}}}\n"
                     for s in order)
    head = f"admin: {{listen: 127.0.0.1:{admin}}}\n" if admin else ""
    routes += (f"  - {{name: gen{generation}, match: {{path_prefix: /gen/}}, "
               f"service: {order[0]}}}\n")
    return head + f"""
servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
{routes}services:
{"".join(declared[s] for s in order)}upstreams:
  pool:
    targets: [{{address: 127.0.0.1:{upstream_port}}}]
{health}"""


ORDERS = [["lax", "strict", "strict2"], ["strict", "lax", "strict2"],
          ["strict2", "strict", "lax"], ["strict", "strict2", "lax"]]


def check_impostor(gw, order):
    for _ in range(2):
        for s in order:
            status, headers, _ = request(gw, "GET", f"/{s}/x")
            if s == "lax":
                assert (status, headers.get("x-upstream")) == (200, "impostor"), (s, order)
            else:
                assert status == 502 and headers.get("x-upstream") is None, (s, order, status)


def test_tls_settings_per_service_hold_across_reloads_that_reorder_the_services(build_dir,
                                                                                tmp_path, certs):
    """An impostor behind a shared upstream: the lax service reaches it, the verifying ones
    never do, whatever order the services come in and across reloads that reorder them, drop
    the lax one and bring it back."""
    impostor = TlsUpstream("impostor", *self_signed(tmp_path))
    port, admin = free_port(), free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(shared(port, impostor.port, certs, ORDERS[0], admin=admin))
    gw = serve_file(build_dir, path)
    try:
        check_impostor(gw, ORDERS[0])
        later = ORDERS[1:] + [["strict"], ["strict", "lax"], ["lax"], ["lax", "strict"]]
        for generation, order in enumerate(later, 1):
            reload_and_wait(gw, path, shared(port, impostor.port, certs, order, admin=admin,
                                             generation=generation),
                            admin, f"gen{generation}")
            check_impostor(gw, order)
    finally:
        assert gw.stop() == 0
        impostor.stop()


def test_one_services_tls_failures_never_eject_the_target_for_another(build_dir, tmp_path,
                                                                       certs):
    """Passive health with max_fails 1: the verifying service's failures against an impostor
    take the target out for it only; the lax service keeps reaching it, in either order."""
    impostor = TlsUpstream("impostor", *self_signed(tmp_path))
    health = "    health: {passive: {max_fails: 1, fail_timeout: 60s}}\n"
    try:
        for order in (["strict", "lax"], ["lax", "strict"]):
            path = tmp_path / "gateway.yaml"
            path.write_text(shared(free_port(), impostor.port, certs, order, health))
            gw = serve_file(build_dir, path)
            try:
                for _ in range(3):
                    assert request(gw, "GET", "/strict/x")[0] in (502, 503)
                for _ in range(3):
                    status, headers, _ = request(gw, "GET", "/lax/x")
                    assert (status, headers.get("x-upstream")) == (200, "impostor"), order
            finally:
                assert gw.stop() == 0
    finally:
        impostor.stop()


def test_reloads_alternating_tls_settings_leave_no_connections_at_the_upstream(build_dir,
                                                                             tmp_path, certs):
    """20 reloads, each changing the service's TLS settings (a new pool each time): the
    upstream sees the old pools' connections closed, never more than a couple at once."""
    real = TlsUpstream("real", f"{certs}/localhost.pem", f"{certs}/localhost.key")
    port, admin = free_port(), free_port()
    text = lambda i: f"""
admin: {{listen: 127.0.0.1:{admin}}}
servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: r{i}, match: {{path_prefix: /}}, service: s}}
services:
  s: {{upstream: pool, tls: {{ca: {certs}/ca.pem{", server_name: localhost" if i % 2 else ""}}}}}
upstreams:
  pool: {{targets: [{{address: "127.0.0.1:{real.port}"}}]}}
"""
    path = tmp_path / "gateway.yaml"
    path.write_text(text(0))
    gw = serve_file(build_dir, path)
    try:
        assert request(gw, "GET", "/x")[0] == 200
        for i in range(1, 21):
            reload_and_wait(gw, path, text(i), admin, f"name: r{i},")
            assert request(gw, "GET", "/x")[0] == 200
        assert real.accepted == 21  # each new settings' pool made one
        assert wait_until(lambda: established_to(real.port) <= 1, 10), established_to(real.port)
    finally:
        assert gw.stop() == 0
        real.stop()


# ---- upstream TLS handshakes: a deadline for the whole --------------------------------------


class TrickleRelay:
    """A TCP relay to 127.0.0.1:`port` that passes the client's bytes at once and the
    server's one byte every `gap` seconds (a stalled or slow TLS server), or none (`gap`
    None). Each connection ends after `cap` seconds at most."""

    def __init__(self, port, gap, cap=15):
        self.target, self.gap, self.cap = port, gap, cap
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, client):
        until = time.monotonic() + self.cap
        server = socket.create_connection(("127.0.0.1", self.target), timeout=5)

        def up():
            try:
                while time.monotonic() < until:
                    data = client.recv(65536)
                    if not data:
                        break
                    server.sendall(data)
            except OSError:
                pass
        threading.Thread(target=up, daemon=True).start()
        pending = b""
        client.settimeout(0.05)
        server.settimeout(0.05)
        try:
            while time.monotonic() < until and self.running:
                try:
                    more = server.recv(65536)
                    if not more and not pending:
                        break
                    pending += more
                except socket.timeout:
                    pass
                if self.gap is not None and pending:
                    client.sendall(pending[:1])
                    pending = pending[1:]
                    time.sleep(self.gap)
                try:
                    if client.recv(1, socket.MSG_PEEK) == b"":
                        break  # the gateway gave up
                except socket.timeout:
                    pass
        except OSError:
            pass
        finally:
            client.close()
            server.close()

    def stop(self):
        self.running = False
        self.sock.close()


@pytest.mark.parametrize("gap", [None, 0.1], ids=["stalled", "trickled"])
def test_an_upstream_tls_handshake_is_bounded_by_the_connect_timeout(build_dir, tmp_path, certs,
                                                                     gap):
    real = TlsUpstream("real", f"{certs}/localhost.pem", f"{certs}/localhost.key")
    relay = TrickleRelay(real.port, gap)
    path = tmp_path / "gateway.yaml"
    path.write_text(f"""
servers:
  - {{listen: 127.0.0.1:0, access_log: off}}
routes:
  - {{name: r, match: {{path_prefix: /}}, service: s}}
services:
  s:
    upstream: pool
    retries: {{attempts: 1}}
    timeouts: {{connect: 1s, first_byte: 20s, read: 20s}}
    tls: {{ca: {certs}/ca.pem, server_name: localhost}}
upstreams:
  pool: {{targets: [{{address: "127.0.0.1:{relay.port}"}}]}}
""")
    gw = serve_file(build_dir, path)
    try:
        start = time.monotonic()
        status = request(gw, "GET", "/x", timeout=30)[0]
        took = time.monotonic() - start
        assert status in (502, 503, 504), status
        assert took < 1 + 1.5, f"the handshake took {took:.1f} s with a 1 s connect timeout"
    finally:
        assert gw.stop() == 0
        relay.stop()
        real.stop()


def test_reloads_alternating_h2_tls_settings_leave_one_connection_at_the_upstream(build_dir,
                                                                                tmp_path, certs):
    up = upstream(build_dir, "h2", keepalive_ms=60_000,
                  tls=(f"{certs}/localhost.pem", f"{certs}/localhost.key"))
    port, admin = free_port(), free_port()
    text = lambda i: f"""
admin: {{listen: 127.0.0.1:{admin}}}
servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: r{i}, match: {{path_prefix: /}}, service: s}}
services:
  s: {{url: "https://127.0.0.1:{up.port}", protocol: h2,
       tls: {{ca: {certs}/ca.pem{", server_name: localhost" if i % 2 else ""}}}}}
"""
    path = tmp_path / "gateway.yaml"
    path.write_text(text(0))
    gw = serve_file(build_dir, path)
    try:
        assert request(gw, "GET", "/plaintext")[0] == 200
        fd_before = fds(gw.proc.pid)
        statuses = []
        for i in range(1, 21):
            reload_and_wait(gw, path, text(i), admin, f"name: r{i},")
            statuses.append(request(gw, "GET", "/plaintext")[0])
        # The first request after each reload: never lost (before: about half were 502
        # "connection closed before the request was written").
        assert statuses == [200] * 20, statuses
        assert wait_until(lambda: established_to(up.port) == 1, 10), established_to(up.port)
        assert wait_until(lambda: fds(gw.proc.pid) <= fd_before + 2, 5), \
            (fd_before, fds(gw.proc.pid))
    finally:
        assert gw.stop() == 0
        up.stop()


@pytest.mark.parametrize("strict_first", [False, True], ids=["lax-first", "strict-first"])
def test_http2_services_sharing_an_impostor_upstream_each_use_their_own_tls(build_dir, tmp_path,
                                                                           certs, strict_first):
    """As test_upstream_tls's case, over HTTP/2 pools (protocol: h2), and across a reload
    that swaps the services' order."""
    impostor = upstream(build_dir, "impostor", tls=self_signed(tmp_path))
    port, admin = free_port(), free_port()

    def text(strict_first, generation):
        lax = "  lax: {upstream: pool, protocol: h2, retries: {attempts: 1}, tls: {verify: false}}\n"
        strict = (f"  strict: {{upstream: pool, protocol: h2, retries: {{attempts: 1}}, "
                  f"tls: {{ca: {certs}/ca.pem, server_name: localhost}}}}\n")
        return f"""
admin: {{listen: 127.0.0.1:{admin}}}
servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: g{generation}, match: {{path_prefix: /lax/}}, middlewares: [{{strip_prefix: /lax}}], service: lax}}
  - {{name: strict, match: {{path_prefix: /strict/}}, middlewares: [{{strip_prefix: /strict}}], service: strict}}
services:
{strict + lax if strict_first else lax + strict}upstreams:
  pool: {{targets: [{{address: 127.0.0.1:{impostor.port}}}]}}
"""
    path = tmp_path / "gateway.yaml"
    path.write_text(text(strict_first, 0))
    gw = serve_file(build_dir, path)
    try:
        for generation in range(3):
            if generation:
                reload_and_wait(gw, path, text(strict_first ^ (generation % 2 == 1), generation),
                                admin, f"name: g{generation},")
            for _ in range(2):
                assert request(gw, "GET", "/lax/plaintext")[0] == 200, generation
                status, _, body = request(gw, "GET", "/strict/plaintext")
                assert status == 502 and b"Hello" not in body, (generation, status, body)
    finally:
        assert gw.stop() == 0
        impostor.stop()
