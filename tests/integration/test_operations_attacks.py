"""Attacks on the promises of docs/operations.md ("When things fail") from an operator's and an
attacker's side, beyond what test_tls_faults, test_log_faults, test_upstream_tls,
test_config_watch and test_dns_faults cover:

- TLS settings belong to the service that declared them in every order and across reloads
  that reorder, add and drop the services sharing an upstream; one service's failures count
  against the target for its own settings only.
- Every handshake has a deadline as a whole (a ClientHello trickled a byte at a time, a client
  that stops after the server's flight), and `http2: only` never answers HTTP/1.1 whatever ALPN
  says.
- The logs' output failing (/dev/full, a folder gone, SIGUSR1 storms, SIGTERM during them)
  costs no request and no exit time.
- The configuration watch survives the file being deleted and written again, a dangling
  symlink, and writes racing a reload storm (the last complete version is in force).
- DNS: one silent or failing server among several, and a name flapping between answers and
  failures, never empty an upstream.
- Many reloads leak neither file descriptors nor upstream connections (counted at the
  upstream)."""
import http.client
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time

import pytest

from conftest import Server, memory_kib, sanitizer_build
from dns_server import AAAA, A, DnsServer
from proxy_support import SERVER, addr, free_port, held_dead_port, logged, request, upstream, wait_until
from test_dns_faults import Named, answers, one_upstream
from test_log_faults import Spindle, hammer, metric, write_config
from test_tls_faults import RawTls, closed_within, h2_preface_and_get
from test_upstream_tls import TlsUpstream, established_to, self_signed


def spindle_bin(build_dir):
    return os.path.join(build_dir, "bin", "spindle")


def serve_file(build_dir, path, threads=1):
    checked = subprocess.run([spindle_bin(build_dir), "check-config", str(path)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    return Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads",
                   str(threads)])


def config_in_force(admin_port):
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
    try:
        conn.request("GET", "/config")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def reload_and_wait(gw, path, text, admin_port, marker):
    """Writes `text` (atomically) and sends SIGHUP; waits until the admin listener's /config
    holds `marker` (the reload's own lines may be suppressed in a storm of them)."""
    staged = path.with_name("staged.yaml")
    staged.write_text(text)
    os.rename(staged, path)
    gw.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: marker in config_in_force(admin_port), 10), gw.errors[-5:]


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


# ---- handshakes: a deadline for the whole, ALPN odd ------------------------------------------

def tls_server(build_dir, tmp_path, certs, handshake="1s", http2="true"):
    config = tmp_path / "tls.yaml"
    config.write_text(f"""
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: off
    http2: {http2}
    timeouts: {{handshake: {handshake}, keepalive: 5s, header: 5s}}
    tls: {{cert: {certs}/localhost.pem, key: {certs}/localhost.key}}
""")
    return Server([spindle_bin(build_dir), "serve", "--config", str(config), "--threads", "1"])


def client_hello():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return tls, incoming, outgoing, outgoing.read()


def test_a_client_hello_trickled_byte_by_byte_is_cut_at_the_handshake_deadline(build_dir,
                                                                             tmp_path, certs):
    """A byte every 200 ms (each read arrives well within any per-read timeout): the handshake
    timeout (1 s) bounds the whole handshake, not each read."""
    server = tls_server(build_dir, tmp_path, certs)
    try:
        _, _, _, hello = client_hello()
        s = socket.create_connection((server.host, server.port), timeout=5)
        start = time.monotonic()
        closed_at = None
        for byte in hello:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic()
                break
            if closed_within(s, 0.2):
                closed_at = time.monotonic()
                break
            if time.monotonic() - start > 8:
                break
        s.close()
        assert closed_at is not None, "held for 8 s of a trickled handshake"
        assert closed_at - start < 1 + 1.5, f"closed after {closed_at - start:.1f} s"
    finally:
        assert server.stop() == 0


def test_a_client_that_stops_after_the_servers_flight_is_cut_at_the_handshake_deadline(
        build_dir, tmp_path, certs):
    """The ClientHello whole, the server's answer read, the client's Finished never sent."""
    server = tls_server(build_dir, tmp_path, certs)
    try:
        held = []
        for _ in range(5):
            tls, incoming, outgoing, hello = client_hello()
            s = socket.create_connection((server.host, server.port), timeout=5)
            s.sendall(hello)
            incoming.write(s.recv(65536))
            held.append(s)
        start = time.monotonic()
        open_ones = [s for s in held if not closed_within(s, 3 - (time.monotonic() - start))]
        assert open_ones == [], f"{len(open_ones)} of 5 held past the handshake timeout"
        for s in held:
            s.close()
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("alpn", [["foo"], ["http/1.0"], ["http/1.1", "foo"], ["", "h2c"]],
                         ids=["foo", "http1.0", "http1.1+foo", "odd"])
def test_http2_only_never_answers_http1_whatever_alpn_offers(build_dir, tmp_path, certs, alpn):
    server = tls_server(build_dir, tmp_path, certs, handshake="5s", http2="only")
    try:
        try:
            c = RawTls(server, [p for p in alpn if p])
        except (ssl.SSLError, ConnectionError, OSError):
            return  # refused in the handshake: never answered in HTTP/1.1
        c.sock.sendall(c.record(b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"))
        try:
            plain = c.read_until(b"\r\n\r\n", seconds=3)
        except (ConnectionError, OSError, ssl.SSLError) as e:
            plain = str(e).encode()
        assert b"HTTP/1" not in plain and b"Hello" not in plain, plain
        c.close()
        # And still serving HTTP/2.
        c = RawTls(server, ["h2"])
        _, first = h2_preface_and_get()
        c.sock.sendall(c.record(first))
        c.read_until(b"Hello, World!")
        c.close()
    finally:
        assert server.stop() == 0


def test_renegotiation_asked_by_a_tls12_client_is_refused_and_costs_nothing(build_dir, tmp_path,
                                                                           certs):
    """`openssl s_client -tls1_2` asks for renegotiation (R) 20 times on one connection: the
    server refuses (no_renegotiation or a close), never crashes, and serves other clients."""
    server = tls_server(build_dir, tmp_path, certs, handshake="5s")
    try:
        script = "R\n" * 20 + "GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"
        done = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}",
                               "-tls1_2", "-servername", "localhost", "-no_ign_eof"],
                              input=script, capture_output=True, text=True, timeout=20)
        assert server.proc.poll() is None
        # A normal client still gets served.
        ctx = ssl.create_default_context(cafile=f"{certs}/ca.pem")
        with socket.create_connection((server.host, server.port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n")
                got = b""
                while b"Hello, World!" not in got:  # the answer in as many reads as it takes
                    more = s.recv(65536)
                    assert more, f"closed before the answer: {got!r}"
                    got += more
        del done
    finally:
        assert server.stop() == 0


# ---- logs: outputs that fail --------------------------------------------------------------

def test_an_access_log_on_dev_full_slows_no_request_and_exits_in_time(build_dir, tmp_path):
    admin = free_port()
    config = write_config(tmp_path, f"""
admin: {{listen: 127.0.0.1:{admin}}}
drain_timeout: 1s
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: {{path: /dev/full}}
""")
    server = Spindle(build_dir, config, read_stdout=True)
    try:
        statuses = hammer(server.port, 2, headers=b"User-Agent: " + b"u" * 2000 + b"\r\n")
        assert set(statuses) == {"200"} and statuses["200"] > 100, statuses
        for sig in [signal.SIGUSR1] * 20:
            server.proc.send_signal(sig)
        statuses = hammer(server.port, 1)
        assert set(statuses) == {"200"}, statuses
        assert server.proc.poll() is None
        assert server.logged("dropped", seconds=10), server.errors[-5:]
    finally:
        code, took = server.stop()
    assert code == 0 and took < 1 + 2, (code, took)


def test_an_access_log_whose_folder_is_gone_survives_sigusr1_storms_and_keeps_its_lines(
        build_dir, tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / "access.log"
    config = write_config(tmp_path, f"""
drain_timeout: 1s
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: {{path: {log}, format: json}}
""")
    server = Spindle(build_dir, config, read_stdout=True)
    try:
        assert hammer(server.port, 30, connections=1, limit=5) == {"200": 5}
        held = open(log)  # the file, through an open descriptor, after its folder is gone
        os.rename(log, tmp_path / "moved.log")
        os.rmdir(folder)
        burst = threading.Thread(target=lambda: [
            (server.proc.send_signal(signal.SIGUSR1), time.sleep(0.002)) for _ in range(200)])
        burst.start()
        statuses = hammer(server.port, 30, path="/plaintext?storm", connections=2, limit=300)
        burst.join()
        assert statuses == {"200": 300}
        assert server.proc.poll() is None
        assert server.logged("cannot open it again")
        # The lines went on to the file it was, each whole.
        lines = lambda: open(tmp_path / "moved.log").read().splitlines()
        assert wait_until(lambda: sum("storm" in l for l in lines()) == 300, 10), len(lines())
        assert all(json.loads(l)["status"] == 200 for l in lines())
        held.close()
        # Bounded lines: the storm of failed reopens did not log a line per signal.
        assert sum("cannot open it again" in l for l in server.errors) <= 40, \
            sum("cannot open it again" in l for l in server.errors)
    finally:
        code, took = server.stop()
    assert code == 0 and took < 1 + 2, (code, took)


def test_sigterm_during_a_sigusr1_storm_with_stdout_stalled_ends_in_time(build_dir, tmp_path):
    admin = free_port()
    config = write_config(tmp_path, f"""
admin: {{listen: 127.0.0.1:{admin}}}
drain_timeout: 1s
servers:
  - listen: 127.0.0.1:0
    default_site: true
    access_log: {{path: "-", buffer: 1m}}
""")
    server = Spindle(build_dir, config)  # nobody reads standard output
    try:
        hammer(server.port, 1.5, headers=b"User-Agent: " + b"u" * 8000 + b"\r\n")
        assert metric(admin, "spindle_log_lines_dropped_total", output="standard output") > 0
        stop = [False]

        def storm():
            while not stop[0] and server.proc.poll() is None:
                try:
                    server.proc.send_signal(signal.SIGUSR1)
                except ProcessLookupError:
                    return
                time.sleep(0.002)
        t = threading.Thread(target=storm)
        t.start()
        time.sleep(0.3)
    finally:
        code, took = server.stop()
        stop[0] = True
        t.join()
    assert code == 0 and took < 1 + 2, (code, took)


# ---- the configuration file ---------------------------------------------------------------

def watched(port, up, route):
    return f"""servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: {route}, match: {{path_prefix: /{route}/}}, middlewares: [{{strip_prefix: /{route}}}],
     service: s}}
services:
  s: {{url: "http://{addr(up)}"}}
"""


@pytest.fixture
def watched_site(build_dir, tmp_path, up):
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(watched(port, up, "one"))
    gw = Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads", "1"])
    yield gw, path, lambda route: watched(port, up, route)
    gw.stop()


def routed(gw, route):
    return request(gw, "GET", f"/{route}/plaintext")[0] == 200


def test_a_config_file_deleted_then_written_again_is_loaded(watched_site):
    gw, path, text = watched_site
    assert routed(gw, "one")
    os.unlink(path)
    time.sleep(0.5)
    assert routed(gw, "one")  # nothing to load: the one in force serves
    path.write_text(text("two"))
    assert wait_until(lambda: routed(gw, "two"), 5), gw.errors[-5:]
    # And the watch still follows it afterwards.
    path.write_text(text("three"))
    assert wait_until(lambda: routed(gw, "three"), 5), gw.errors[-5:]


def test_a_dangling_symlink_renamed_over_the_config_is_refused_and_followed_later(watched_site,
                                                                                 tmp_path):
    gw, path, text = watched_site
    staged = tmp_path / "staged"
    target = tmp_path / "later.yaml"
    os.symlink(target, staged)
    os.rename(staged, path)
    assert logged(gw, "rejected", seconds=5), gw.errors[-5:]
    assert routed(gw, "one")
    # The target appears (written elsewhere and renamed into place): loaded.
    (tmp_path / "later.tmp").write_text(text("two"))
    os.rename(tmp_path / "later.tmp", target)
    gw.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: routed(gw, "two"), 5), gw.errors[-5:]


def test_writes_racing_a_reload_storm_leave_the_last_complete_version_in_force(watched_site,
                                                                             tmp_path):
    """Versions renamed into place every few ms while SIGHUP comes as fast: afterwards the
    last version is in force (no reload loaded an older file after a newer one)."""
    gw, path, text = watched_site
    stop = [False]

    def signals():
        while not stop[0]:
            gw.proc.send_signal(signal.SIGHUP)
            time.sleep(0.003)
    t = threading.Thread(target=signals)
    t.start()
    try:
        for i in range(60):
            staged = tmp_path / f"v{i}.tmp"
            staged.write_text(text(f"v{i}"))
            os.rename(staged, path)
            time.sleep(0.01)
    finally:
        stop[0] = True
        t.join()
    assert wait_until(lambda: routed(gw, "v59"), 10), gw.errors[-5:]
    time.sleep(1)
    assert routed(gw, "v59") and not routed(gw, "v58")
    assert gw.proc.poll() is None


# ---- DNS: one server failing, a name flapping ----------------------------------------------

@pytest.mark.parametrize("fault", ["silent", "servfail", "refused"])
def test_one_failing_dns_server_among_two_never_empties_the_upstream(build_dir, tmp_path, fault):
    bad, good = DnsServer(), DnsServer()
    one = Named("127.0.0.2", "one")
    if fault == "silent":
        bad.silent = True
    else:
        bad.fail("api.test", A, fault)
        bad.fail("api.test", AAAA, fault)
    good.set("api.test", A, "127.0.0.2", ttl=1)
    good.fail("api.test", AAAA, "nodata")
    path = tmp_path / "gateway.yaml"
    path.write_text(SERVER + f'dns: {{servers: ["{bad.address}", "{good.address}"], min_ttl: 1s,'
                    f' timeout: 500ms, stale_grace: 0s}}\n' + one_upstream("api.test", one.port))
    gw = Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads", "1"])
    try:
        assert wait_until(lambda: answers(gw, 1) == ["one"], 10), gw.errors[-5:]
        # Several TTLs with the first server failing: the name stays answered.
        until = time.monotonic() + 4
        seen = []
        while time.monotonic() < until:
            seen += answers(gw, 1)
            time.sleep(0.1)
        assert set(seen) == {"one"}, [s for s in seen if s != "one"][:5]
    finally:
        gw.stop()
        one.stop()
        bad.stop()
        good.stop()


def test_a_name_flapping_between_answers_and_failures_is_never_emptied_within_its_grace(
        build_dir, tmp_path):
    dns = DnsServer()
    one = Named("127.0.0.2", "one")
    dns.set("api.test", A, "127.0.0.2", ttl=1)
    dns.fail("api.test", AAAA, "servfail")
    path = tmp_path / "gateway.yaml"
    path.write_text(SERVER + f'dns: {{servers: ["{dns.address}"], min_ttl: 1s, timeout: 300ms,'
                    f' stale_grace: 30s}}\n' + one_upstream("api.test", one.port))
    gw = Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads", "1"])
    stop = [False]

    def flap():
        faults = ["servfail", "silent", "garbage", "refused", "truncate"]
        i = 0
        while not stop[0]:
            if i % 2:
                dns.set("api.test", A, "127.0.0.2", ttl=1)
            elif faults[i // 2 % len(faults)] == "truncate":
                dns.truncate("api.test", A, "127.0.0.2", ttl=1)
            else:
                dns.fail("api.test", A, faults[i // 2 % len(faults)])
            dns.fail("api.test", AAAA, faults[(i + 1) // 2 % len(faults)] if
                     faults[(i + 1) // 2 % len(faults)] != "truncate" else "servfail")
            i += 1
            time.sleep(0.7)
    try:
        assert wait_until(lambda: answers(gw, 1) == ["one"], 10)
        t = threading.Thread(target=flap)
        t.start()
        seen = []
        until = time.monotonic() + 8
        while time.monotonic() < until:
            seen += answers(gw, 1)
            time.sleep(0.1)
        stop[0] = True
        t.join()
        assert set(seen) == {"one"}, [s for s in seen if s != "one"][:5]
    finally:
        stop[0] = True
        gw.stop()
        one.stop()
        dns.stop()


# ---- many reloads: no leak ---------------------------------------------------------------

def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_many_reloads_leak_no_descriptors_memory_or_upstream_connections(build_dir, tmp_path):
    up = upstream(build_dir, "a", keepalive_ms=60_000)
    port, admin = free_port(), free_port()
    text = lambda i: f"""
admin: {{listen: 127.0.0.1:{admin}}}
servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: r{i}, match: {{path_prefix: /}}, service: s}}
services:
  s: {{url: "http://{addr(up)}", retries: {{attempts: 2}}}}
"""
    path = tmp_path / "gateway.yaml"
    path.write_text(text(0))
    gw = serve_file(build_dir, path)
    try:
        for i in range(1, 11):  # warm
            reload_and_wait(gw, path, text(i), admin, f"name: r{i},")
            assert request(gw, "GET", "/plaintext")[0] == 200
        fd_before, rss_before = fds(gw.proc.pid), memory_kib(gw.proc.pid)
        for i in range(11, 111):
            reload_and_wait(gw, path, text(i), admin, f"name: r{i},")
            assert request(gw, "GET", "/plaintext")[0] == 200
        assert wait_until(lambda: fds(gw.proc.pid) <= fd_before + 2, 5), \
            (fd_before, fds(gw.proc.pid))
        grown = memory_kib(gw.proc.pid) - rss_before
        # (A sanitizer build holds freed memory back in its quarantine: the bound is release's.)
        assert grown < 8 * 1024 or sanitizer_build(build_dir), f"grew {grown} KiB over 100 reloads"
        assert established_to(up.port) <= 2, established_to(up.port)
    finally:
        assert gw.stop() == 0
        up.stop()


# ---- a SIGHUP while the file is being written in place ------------------------------------

def test_a_sighup_while_the_file_is_written_in_place_loads_no_half_file(build_dir, tmp_path, up):
    """A configuration tool rewrites the file in place while something (logrotate's
    postrotate, systemd's ExecReload, an operator) sends SIGHUP: the half written so far is
    valid YAML without the admin route's basic_auth. It must not be loaded."""
    from test_config_watch import version
    import base64
    import hashlib
    users = tmp_path / "users"
    users.write_text("admin:{SHA}" + base64.b64encode(hashlib.sha1(b"secret").digest()).decode()
                     + "\n")
    port = free_port()
    path = tmp_path / "gateway.yaml"
    full = version(port, addr(up), users)
    path.write_text(full)
    gw = Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads", "1"])
    try:
        assert request(gw, "GET", "/admin/x")[0] == 401
        cut = full.index("    middlewares")
        with open(path, "w") as writer:
            writer.write(full[:cut])
            writer.flush()
            time.sleep(0.2)
            gw.proc.send_signal(signal.SIGHUP)
            until = time.monotonic() + 1.5
            statuses = set()
            while time.monotonic() < until:
                statuses.add(request(gw, "GET", "/admin/x")[0])
                time.sleep(0.05)
            assert logged(gw, "SIGHUP", "is being written")
            writer.write(full[cut:])
        assert statuses == {401}, f"the half file was loaded: /admin/x answered {statuses}"
        # The SIGHUP is not lost: once the writer closed the file, the reload it asked for runs.
        assert logged(gw, "SIGHUP", "in force", seconds=8)
        assert request(gw, "GET", "/admin/x")[0] == 401
    finally:
        gw.stop()


# ---- DNS: the last answer across a reload that changes the DNS settings -------------------

@pytest.mark.parametrize("change", ["timeout", "servers", "min_ttl"])
def test_a_reload_changing_dns_settings_keeps_the_last_answer_within_its_grace(build_dir,
                                                                              tmp_path, change):
    dns = DnsServer()
    other = DnsServer()
    other.silent = True
    one = Named("127.0.0.2", "one")
    dns.set("api.test", A, "127.0.0.2", ttl=1)
    dns.fail("api.test", AAAA, "nodata")
    admin = free_port()
    path = tmp_path / "gateway.yaml"
    text = lambda keys: (f"admin: {{listen: 127.0.0.1:{admin}}}\n" + SERVER +
                         f"dns: {{{keys}, stale_grace: 60s}}\n" +
                         one_upstream("api.test", one.port))
    first = f'servers: ["{dns.address}"], min_ttl: 1s, timeout: 300ms'
    second = {"timeout": f'servers: ["{dns.address}"], min_ttl: 1s, timeout: 400ms',
              "servers": f'servers: ["{dns.address}", "{other.address}"], min_ttl: 1s, '
                         f'timeout: 300ms',
              "min_ttl": f'servers: ["{dns.address}"], min_ttl: 2s, timeout: 300ms'}[change]
    path.write_text(text(first))
    gw = Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads", "1"])
    try:
        assert wait_until(lambda: answers(gw, 1) == ["one"], 10)
        # The server now fails every lookup; the last answer holds for a minute.
        dns.fail("api.test", A, "servfail")
        time.sleep(1.5)
        assert answers(gw, 3) == ["one"] * 3
        reload_and_wait(gw, path, text(second), admin, second.split(",")[-1].strip())
        seen = []
        until = time.monotonic() + 3
        while time.monotonic() < until:
            seen += answers(gw, 1)
            time.sleep(0.1)
        assert set(seen) == {"one"}, f"emptied by the reload: {seen}"
    finally:
        gw.stop()
        one.stop()
        dns.stop()
        other.stop()


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


# ---- DNS: the TCP fallback after TC stalls or is cut ------------------------------------------

class StallingTcpDns(DnsServer):
    """Answers over TCP as told by `tcp_mode`: "answer", "stall" (reads the query, says
    nothing), "cut" (the length prefix and half the reply, then silence)."""

    tcp_mode = "answer"

    def _tcp_connection(self, conn):
        if self.tcp_mode == "answer":
            return super()._tcp_connection(conn)
        conn.settimeout(10)
        with conn:
            try:
                data = conn.recv(4096)
                if self.tcp_mode == "cut" and len(data) > 2:
                    reply = self._answer(data[2:], "tcp")
                    if reply:
                        conn.sendall(struct.pack("!H", len(reply)) + reply[:len(reply) // 2])
                time.sleep(5)
            except OSError:
                pass


@pytest.mark.parametrize("mode", ["stall", "cut"])
def test_a_tcp_fallback_that_stalls_keeps_the_last_answer(build_dir, tmp_path, mode):
    dns = StallingTcpDns()
    one = Named("127.0.0.2", "one")
    dns.set("api.test", A, "127.0.0.2", ttl=1)
    dns.fail("api.test", AAAA, "nodata")
    path = tmp_path / "gateway.yaml"
    path.write_text(SERVER + f'dns: {{servers: ["{dns.address}"], min_ttl: 1s, timeout: 600ms,'
                    f' stale_grace: 60s}}\n' + one_upstream("api.test", one.port))
    gw = Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads", "1"])
    try:
        assert wait_until(lambda: answers(gw, 1) == ["one"], 10)
        # Now UDP says "truncated" and TCP stalls (or is cut): the lookups fail, the last
        # answer holds.
        dns.tcp_mode = mode
        dns.truncate("api.test", A, *[f"127.0.0.{i}" for i in range(2, 200)], ttl=1)
        seen = []
        until = time.monotonic() + 4
        while time.monotonic() < until:
            seen += answers(gw, 1)
            time.sleep(0.1)
        assert set(seen) == {"one"}, [s for s in seen if s != "one"][:5]
        # SIGTERM at once, whatever the TCP lookup does.
        start = time.monotonic()
        assert gw.stop() == 0
        assert time.monotonic() - start < 3
    finally:
        gw.stop()
        one.stop()
        dns.stop()


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
