"""DNS discovery under faults, against the suite's own authoritative DNS server (dns_server.py:
UDP and TCP, A, AAAA and SRV from a table the test changes; SERVFAIL, REFUSED, NXDOMAIN, empty
answers, silence, truncation, replies that are not DNS).

- Each address family stands alone: a name whose A is answered serves those addresses whatever
  its AAAA does (and the other way round), and follows its A record's changes.
- A failed lookup keeps the family's last answer until its TTL plus dns.stale_grace, then drops
  it (logged, counted in /metrics).
- Lookups never hold the main thread: the names are asked at once (not one after another),
  a reload uses the answers already there (waiting, without blocking, only for names it
  brings), and SIGTERM is honoured at once whatever the DNS server does.
- SRV records of every priority are kept: a higher priority's targets are backups, used when
  every target of the lower ones is down; weights share the load within a priority.
- What a hostile DNS server can do is bounded: 0 TTLs, huge answers, odd SRV targets."""
import http.client
import http.server
import os
import signal
import threading
import time

import pytest

from conftest import Server
from dns_server import A, AAAA, SRV, answers
from proxy_support import SERVER, free_port, held_dead_port, logged, request, wait_until


class Named:
    """An HTTP server on `host` answering its `name` to every GET; while `up` is False it
    answers 503 (its health checks fail)."""

    def __init__(self, host, name, port=0):
        self.up = True
        named = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                body = name.encode() if named.up else b"down"
                self.send_response(200 if named.up else 503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        family = http.server.ThreadingHTTPServer
        if ":" in host:
            class V6(http.server.ThreadingHTTPServer):
                address_family = __import__("socket").AF_INET6
            family = V6
        self.server = family((host, port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def start(build_dir, tmp_path, dns, body, dns_keys="", threads=1, env=None):
    """spindle with `body` (routes, services, upstreams) and DNS from `dns`."""
    path = tmp_path / "gateway.yaml"
    path.write_text(SERVER + f"dns: {{servers: [\"{dns.address}\"], min_ttl: 1s{dns_keys}}}\n" +
                    body)
    return Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                   "--threads", str(threads)], env=env)


def one_upstream(name, port, balancer="round_robin", extra=""):
    return f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: api}}
services:
  api: {{upstream: api{extra}}}
upstreams:
  api:
    balancer: {balancer}
    targets: [{{address: "{name}:{port}"}}]
"""


# ---- each address family stands alone --------------------------------------------------------

FAULTS = ["servfail", "refused", "silent", "garbage", "nxdomain", "nodata"]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("failing", ["AAAA", "A"])
def test_a_family_that_fails_leaves_the_other_familys_addresses(build_dir, tmp_path, dns, fault,
                                                                failing):
    """A answered and AAAA failing (any way), or AAAA answered and A failing: the upstream has
    the answered family's addresses from the first request on."""
    host = "127.0.0.2" if failing == "AAAA" else "::1"
    one = Named(host, "one")
    if failing == "AAAA":
        dns.set("api.test", A, "127.0.0.2")
        dns.fail("api.test", AAAA, fault)
    else:
        dns.set("api.test", AAAA, "::1")
        dns.fail("api.test", A, fault)
    gw = start(build_dir, tmp_path, dns, one_upstream("api.test", one.port), ", timeout: 600ms")
    try:
        assert set(answers(gw, 6)) == {"one"}
        # And it stays so over the next lookups (TTL 1 s).
        time.sleep(2.5)
        assert set(answers(gw, 6)) == {"one"}
    finally:
        gw.stop()
        one.stop()


def test_a_resolved_name_follows_its_a_record_while_its_aaaa_fails(build_dir, tmp_path, dns):
    one, two = Named("127.0.0.2", "one"), None
    two = Named("127.0.0.3", "two", one.port)
    dns.set("api.test", A, "127.0.0.2")
    dns.fail("api.test", AAAA, "servfail")
    gw = start(build_dir, tmp_path, dns, one_upstream("api.test", one.port), ", timeout: 600ms")
    try:
        assert set(answers(gw, 4)) == {"one"}
        dns.set("api.test", A, "127.0.0.3")
        assert wait_until(lambda: set(answers(gw, 4)) == {"two"}, seconds=6)
        # AAAA answers too now: both families' addresses are targets.
        dns.set("api.test", AAAA, "::1")
        three = Named("::1", "three", one.port)
        try:
            assert wait_until(lambda: set(answers(gw, 8)) == {"two", "three"}, seconds=6)
        finally:
            three.stop()
    finally:
        gw.stop()
        one.stop()
        two.stop()


def test_a_failed_lookup_keeps_the_last_answer_until_its_ttl_and_the_grace(build_dir, tmp_path,
                                                                            dns):
    one = Named("127.0.0.2", "one")
    dns.set("api.test", A, "127.0.0.2", ttl=1)
    dns.fail("api.test", AAAA, "nodata")
    admin = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(f"admin: {{listen: 127.0.0.1:{admin}}}\n" + SERVER +
                    f"dns: {{servers: [\"{dns.address}\"], min_ttl: 1s, timeout: 300ms,"
                    f" stale_grace: 3s}}\n" + one_upstream("api.test", one.port))
    gw = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                 "--threads", "1"])
    try:
        assert set(answers(gw, 3)) == {"one"}
        dns.fail("api.test", A, "servfail")
        failing_since = time.monotonic()
        # The last answer came at most a TTL (1 s) before: it is good until at least 3 s
        # (the grace) from now.
        while time.monotonic() < failing_since + 2.4:
            assert answers(gw, 1) == ["one"]
            time.sleep(0.1)
        assert logged(gw, "dns: api.test A:", "keeping the last answer")
        assert metric(admin_metrics(admin), "spindle_dns_stale_answers") == 1
        # Then it is dropped: no target.
        assert wait_until(lambda: answers(gw, 1) == [503], seconds=6)
        assert logged(gw, "dns: api.test A:", "dropped")
        metrics = admin_metrics(admin)
        assert metric(metrics, "spindle_dns_stale_answers") == 0
        assert metric(metrics, 'spindle_dns_lookups_total{type="A",outcome="failed"}') >= 2
        assert metric(metrics, 'spindle_dns_lookups_total{type="A",outcome="answered"}') >= 1
        # The name answers again: traffic again.
        dns.set("api.test", A, "127.0.0.2")
        assert wait_until(lambda: answers(gw, 1) == ["one"], seconds=6)
    finally:
        gw.stop()
        one.stop()


def admin_metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def metric(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {series} in /metrics")


def test_an_authoritative_negative_answer_empties_the_name_at_once(build_dir, tmp_path, dns):
    """NXDOMAIN is an answer, not a failure: no grace (the name is gone)."""
    one = Named("127.0.0.2", "one")
    dns.set("api.test", A, "127.0.0.2")
    gw = start(build_dir, tmp_path, dns, one_upstream("api.test", one.port),
               ", timeout: 300ms, stale_grace: 1h")
    try:
        assert answers(gw, 1) == ["one"]
        dns.rules.clear()
        assert wait_until(lambda: answers(gw, 1) == [503], seconds=5)
    finally:
        gw.stop()
        one.stop()


def test_each_family_is_asked_again_on_its_own_ttl(build_dir, tmp_path, dns):
    """A with TTL 1 s, no AAAA with a negative TTL of 30 s (the SOA's MINIMUM): A is asked
    every second, AAAA once."""
    one = Named("127.0.0.2", "one")
    dns.negative_ttl = 30
    dns.set("api.test", A, "127.0.0.2", ttl=1)
    dns.set("api.test", AAAA)
    gw = start(build_dir, tmp_path, dns, one_upstream("api.test", one.port))
    try:
        time.sleep(4)
        assert len(dns.asked("api.test", AAAA)) == 1
        assert len(dns.asked("api.test", A)) >= 3
        assert answers(gw, 2) == ["one"] * 2
    finally:
        gw.stop()
        one.stop()


# ---- what a hostile or broken DNS server can do ---------------------------------------------

def test_ttl_zero_and_an_answer_new_at_every_query_are_bounded_by_min_ttl(build_dir, tmp_path,
                                                                          dns):
    """TTL 0, and another address at every query: asked again, and the gateway built again,
    no more often than min_ttl (1 s), not in a loop."""
    anywhere = Named("0.0.0.0", "any")
    counter = iter(range(1, 1 << 20))
    dns.set("api.test", A, lambda: [f"127.0.3.{next(counter) % 250 + 1}"], ttl=0)
    dns.set("api.test", AAAA, ttl=0)
    gw = start(build_dir, tmp_path, dns, one_upstream("api.test", anywhere.port))
    try:
        since, built = time.monotonic(), len(gw.errors)
        time.sleep(4)
        asked = len(dns.asked("api.test", A, since=since))
        rebuilt = sum("dns: upstream api now has" in line for line in gw.errors[built:])
        # Four or five times in four seconds, not thousands.
        assert 2 <= asked <= 6, asked
        assert 2 <= rebuilt <= 6, rebuilt
        assert answers(gw, 4) == ["any"] * 4
    finally:
        gw.stop()
        anywhere.stop()


def test_a_truncated_answer_is_asked_again_over_tcp(build_dir, tmp_path, dns):
    one = Named("127.0.0.2", "one")
    dns.truncate("api.test", A, "127.0.0.2")
    dns.fail("api.test", AAAA, "nodata")
    gw = start(build_dir, tmp_path, dns, one_upstream("api.test", one.port))
    try:
        assert set(answers(gw, 4)) == {"one"}
        assert any(q[3] == "tcp" for q in dns.asked("api.test", A))
    finally:
        gw.stop()
        one.stop()


def test_a_huge_answer_gives_at_most_64_targets(build_dir, tmp_path, dns):
    # One server on every loopback address: whichever target is picked answers.
    anywhere = Named("0.0.0.0", "any")
    dns.set("api.test", A, "127.0.0.2")
    dns.fail("api.test", AAAA, "nodata")
    gw = start(build_dir, tmp_path, dns, one_upstream("api.test", anywhere.port))
    try:
        assert answers(gw, 1) == ["any"]
        # 600 addresses: more than UDP holds (TC, then TCP), far more than an upstream needs.
        dns.set("api.test", A, *[f"127.0.{i // 200 + 1}.{i % 200 + 1}" for i in range(600)])
        assert logged(gw, "dns: upstream api now has 64 target(s)", seconds=6)
        assert set(answers(gw, 20)) == {"any"}
    finally:
        gw.stop()
        anywhere.stop()


def test_hostile_srv_records_are_bounded(build_dir, tmp_path, dns):
    """Of SRV records naming the root (no service), port 0, a name no host may have (bytes a
    header must never carry), or 500 names, none breaks the others: the good targets serve,
    the odd names are never asked, at most 64 records are used, and weights beyond 1000 keep
    their proportions."""
    a = Named("127.0.0.2", "a")
    b = Named("127.0.0.3", "b")
    srv = "_http._tcp.api.test"
    records = [(10, 65535, a.port, "a.api.test"), (10, 21845, b.port, "b.api.test"),
               (10, 1, a.port, "."), (10, 1, 0, "zero.api.test"),
               (10, 1, a.port, [b"bad\r\nx-injected: 1", b"api", b"test"])]
    records += [(20 + i, 1, a.port, f"n{i}.api.test") for i in range(500)]
    dns.set(srv, SRV, *records)
    dns.set("a.api.test", A, "127.0.0.2")
    dns.set("b.api.test", A, "127.0.0.3")
    gw = start(build_dir, tmp_path, dns, f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: api}}
services:
  api: {{upstream: api}}
upstreams:
  api:
    balancer: weighted
    srv: {srv}
""")
    try:
        got = answers(gw, 40)
        assert got.count("a") == 30 and got.count("b") == 10, got  # 65535:21845 = 3:1
        time.sleep(1.5)
        asked = {q[1] for q in dns.asked(qtype=A)}
        assert "zero.api.test" not in asked
        assert not any("injected" in name for name in asked)
        # The lowest 64 records' names at most (two good ones, 62 backups).
        assert len(asked) <= 64, len(asked)
    finally:
        gw.stop()
        a.stop()
        b.stop()


# ---- lookups never hold the main thread -----------------------------------------------------

SIX_NAMES = """
routes:
  - {name: local, match: {path_prefix: /local}, service: local}
""" + "".join(f"  - {{name: r{i}, match: {{path_prefix: /n{i}}}, service: s{i}}}\n"
              for i in range(6)) + """services:
  local: {url: "http://127.0.0.1:PORT"}
""" + "".join(f"  s{i}: {{upstream: u{i}}}\n" for i in range(6)) + "upstreams:\n" + "".join(
    f"  u{i}: {{targets: [{{address: \"n{i}.api.test:80\"}}]}}\n" for i in range(6))


def test_a_silent_dns_server_holds_neither_start_reload_nor_sigterm(build_dir, tmp_path, dns):
    local = Named("127.0.0.2", "local")
    dns.silent = True
    body = SIX_NAMES.replace("http://127.0.0.1:PORT", f"http://127.0.0.2:{local.port}")
    began = time.monotonic()
    gw = start(build_dir, tmp_path, dns, body, ", timeout: 2s", threads=2)
    try:
        started = time.monotonic() - began
        # The twelve lookups (six names, A and AAAA) went out together, not one after another.
        firsts = [min(q[0] for q in dns.asked(f"n{i}.api.test")) for i in range(6)]
        assert max(firsts) - min(firsts) < 1.0, firsts
        # Six names one after another would take 12 s and more.
        assert started < 6, started
        assert request(gw, "GET", "/n0")[0] == 503  # no address for n0 yet
        assert request(gw, "GET", "/local")[2] == b"local"
        # A reload while the DNS server is silent: the answers there are serve at once.
        before = len(gw.errors)
        gw.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: any("reload (SIGHUP)" in line and "in force" in line
                                      for line in gw.errors[before:]), seconds=1.5)
        # Reloads in a storm, then SIGTERM: it exits within its drain time, not after lookups.
        for _ in range(20):
            gw.proc.send_signal(signal.SIGHUP)
        assert request(gw, "GET", "/local")[2] == b"local"
        stopping = time.monotonic()
        assert gw.stop(timeout=30) == 0
        assert time.monotonic() - stopping < 4, time.monotonic() - stopping
    finally:
        gw.stop()
        local.stop()


def test_a_reload_waits_for_the_names_it_brings_without_blocking(build_dir, tmp_path, dns):
    """A reload that brings a name waits for its first answer before it switches (no request
    of the new route finds no target), while the main thread serves signals: a SIGTERM during
    that wait is honoured at once."""
    one, two = Named("127.0.0.2", "one"), Named("127.0.0.3", "two")
    dns.set("one.test", A, "127.0.0.2")
    dns.set("one.test", AAAA)
    gw = start(build_dir, tmp_path, dns, one_upstream("one.test", one.port), ", timeout: 4s")
    path = tmp_path / "gateway.yaml"
    try:
        assert answers(gw, 1) == ["one"]
        # The new name answers: the reload is in force with it, and its route answers at once.
        dns.set("two.test", A, "127.0.0.3")
        dns.set("two.test", AAAA)
        path.write_text(path.read_text().replace(f"one.test:{one.port}", f"two.test:{two.port}"))
        before = len(gw.errors)
        gw.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: any("reload (SIGHUP)" in line and "in force" in line
                                      for line in gw.errors[before:]), seconds=5)
        assert answers(gw, 4) == ["two"] * 4
        # A name the DNS server never answers: the reload waits (up to twice dns.timeout)...
        dns.fail("three.test", A, "silent")
        dns.fail("three.test", AAAA, "silent")
        path.write_text(path.read_text().replace(f"two.test:{two.port}", f"three.test:{two.port}"))
        gw.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: dns.asked("three.test"), seconds=2)
        # ...serving the configuration in force meanwhile, and SIGTERM ends it at once (not
        # after the 4 s the lookups may take).
        assert answers(gw, 2) == ["two"] * 2
        stopping = time.monotonic()
        assert gw.stop(timeout=30) == 0
        assert time.monotonic() - stopping < 2, time.monotonic() - stopping
    finally:
        gw.stop()
        one.stop()
        two.stop()


def test_a_newer_reload_drops_the_one_waiting_even_when_it_is_refused(build_dir, tmp_path, dns):
    one = Named("127.0.0.2", "one")
    dns.set("one.test", A, "127.0.0.2")
    dns.set("one.test", AAAA)
    dns.fail("late.test", A, "silent")
    dns.fail("late.test", AAAA, "silent")
    gw = start(build_dir, tmp_path, dns, one_upstream("one.test", one.port), ", timeout: 1s")
    path = tmp_path / "gateway.yaml"
    good = path.read_text()
    try:
        # Waits for late.test (up to 2.2 s)...
        path.write_text(good.replace(f"one.test:{one.port}", "late.test:80"))
        gw.proc.send_signal(signal.SIGHUP)
        assert logged(gw, "waiting up to", "for the first answers")
        # ...when a broken version comes: refused, and the waiting one with it.
        path.write_text(good + "nonsense: [\n")
        gw.proc.send_signal(signal.SIGHUP)
        assert logged(gw, "reload (SIGHUP) rejected")
        time.sleep(3)
        assert answers(gw, 4) == ["one"] * 4
        assert not logged(gw, "reload (SIGHUP): configuration from", seconds=0.1)
    finally:
        gw.stop()
        one.stop()


def test_a_reload_storm_leaves_only_the_last_reloads_names_looked_up(build_dir, tmp_path, dns):
    """Twenty reloads in a row, each bringing a name the DNS server never answers: the last one
    wins, the names of those it replaced are no longer asked, and SIGTERM is prompt."""
    one = Named("127.0.0.2", "one")
    dns.set("one.test", A, "127.0.0.2")
    dns.set("one.test", AAAA)
    gw = start(build_dir, tmp_path, dns, one_upstream("one.test", one.port), ", timeout: 1s")
    path = tmp_path / "gateway.yaml"
    head = path.read_text().split("\nroutes:")[0]
    try:
        for i in range(20):
            dns.fail(f"s{i}.test", A, "silent")
            path.write_text(head + f"""
routes:
  - {{name: extra, match: {{path_prefix: /extra}}, service: extra}}
  - {{name: all, match: {{path_prefix: /}}, service: api}}
services:
  api: {{upstream: api}}
  extra: {{upstream: extra}}
upstreams:
  api: {{targets: [{{address: "one.test:{one.port}"}}]}}
  extra: {{targets: [{{address: "s{i}.test:80"}}]}}
""")
            gw.proc.send_signal(signal.SIGHUP)
            time.sleep(0.05)
        assert answers(gw, 2) == ["one"] * 2
        # The last reload goes in force after its wait (up to 2 x 1 s); then only its name and
        # one.test are asked.
        assert logged(gw, "reload (", "in force", seconds=8)
        time.sleep(1.5)
        since = time.monotonic()
        time.sleep(2.5)
        asked = {q[1] for q in dns.asked(since=since)}
        assert asked <= {"one.test", "s19.test"}, asked
        stopping = time.monotonic()
        assert gw.stop(timeout=30) == 0
        assert time.monotonic() - stopping < 2
    finally:
        gw.stop()
        one.stop()


# ---- SRV priorities: backups ------------------------------------------------------------------

def srv_upstream(srv, extra="", balancer="weighted"):
    return f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: api}}
services:
  api: {{upstream: api{extra}}}
upstreams:
  api:
    balancer: {balancer}
    srv: {srv}
    health:
      # A down target answers 503 at once; the timeout only has to outlast a loaded machine.
      active: {{path: /, interval: 100ms, timeout: 3s, healthy: 1, unhealthy: 1}}
"""


BALANCERS = ["round_robin", "weighted", "least_connections", "random_two",
             "{consistent_hash: {by: header, key: x-user}}"]


@pytest.mark.parametrize("balancer", BALANCERS)
def test_every_balancer_uses_srv_primaries_then_backups(build_dir, tmp_path, dns, balancer):
    """Whatever the balancer, SRV targets take the requests: the primary while it is up, the
    backups (both: every balancer spreads keys or turns) while it is down."""
    a, b, c = Named("127.0.0.2", "a"), Named("127.0.0.3", "b"), Named("127.0.0.4", "c")
    srv = "_http._tcp.api.test"
    dns.set(srv, SRV, (10, 1, a.port, "a.api.test"), (20, 1, b.port, "b.api.test"),
            (20, 1, c.port, "c.api.test"))
    for name, ip in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4")):
        dns.set(f"{name}.api.test", A, ip)
    gw = start(build_dir, tmp_path, dns, srv_upstream(srv, balancer=balancer), ", srv_refresh: 1s")

    def keyed(count):
        out = []
        for i in range(count):
            status, _, body = request(gw, "GET", "/", headers={"x-user": f"user{i}"})
            out.append(body.decode() if status == 200 else status)
        return out

    try:
        assert keyed(20) == ["a"] * 20
        a.up = False
        assert wait_until(lambda: 503 not in keyed(8) and "a" not in keyed(8), seconds=5)
        got = keyed(40)
        assert set(got) == {"b", "c"}, got
        a.up = True
        assert wait_until(lambda: keyed(8) == ["a"] * 8, seconds=5)
    finally:
        gw.stop()
        for s in (a, b, c):
            s.stop()


def test_srv_backups_take_the_load_while_every_primary_is_down(build_dir, tmp_path, dns):
    a = Named("127.0.0.2", "a")
    b = Named("127.0.0.3", "b")
    c = Named("127.0.0.4", "c")
    srv = "_http._tcp.api.test"
    dns.set(srv, SRV, (10, 1, a.port, "a.api.test"), (20, 3, b.port, "b.api.test"),
            (20, 1, c.port, "c.api.test"))
    for name, ip in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4")):
        dns.set(f"{name}.api.test", A, ip)
    gw = start(build_dir, tmp_path, dns, srv_upstream(srv), ", srv_refresh: 1s")
    try:
        # The primary is up: it takes everything, the backups nothing.
        assert answers(gw, 20) == ["a"] * 20
        a.up = False
        assert wait_until(lambda: 503 not in answers(gw, 8), seconds=5)
        got = answers(gw, 40)
        assert got.count("b") == 30 and got.count("c") == 10, got  # weights within priority 20
        # The primary is back: the load goes back to it.
        a.up = True
        assert wait_until(lambda: answers(gw, 8) == ["a"] * 8, seconds=5)
    finally:
        gw.stop()
        for s in (a, b, c):
            s.stop()


def test_a_retry_goes_to_a_backup_when_every_primary_failed(build_dir, tmp_path, dns):
    dead, dead_port = held_dead_port()
    b = Named("127.0.0.3", "b")
    srv = "_http._tcp.api.test"
    dns.set(srv, SRV, (10, 1, dead_port, "a.api.test"), (20, 1, b.port, "b.api.test"))
    dns.set("a.api.test", A, "127.0.0.1")
    dns.set("b.api.test", A, "127.0.0.3")
    gw = start(build_dir, tmp_path, dns, f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: api}}
services:
  api: {{upstream: api, retries: {{attempts: 2, budget: 100%}}}}
upstreams:
  api:
    srv: {srv}
""")
    try:
        # Every request: the primary refuses, the retry goes to the backup.
        assert answers(gw, 10) == ["b"] * 10
    finally:
        gw.stop()
        dead.close()
        b.stop()


# ---- every lookup off the main thread: the Redis's name, the hosts file ----------------------

def limited_by_redis(redis_name, redis_port, upstream_port):
    return f"""
redis: {{address: "{redis_name}:{redis_port}", timeout: 200ms}}
routes:
  - name: all
    match: {{path_prefix: /}}
    middlewares:
      - rate_limit: {{key: route, rate: 1/s, burst: 5, store: redis, failure_mode: closed}}
    service: api
services:
  api: {{url: "http://127.0.0.2:{upstream_port}"}}
"""


def test_a_redis_named_in_dns_is_resolved_by_discovery_and_used(build_dir, tmp_path, dns):
    """The Redis's host name is discovery's to look up (the DNS server the configuration names),
    not the system resolver's on the main thread: the shared limit works through it."""
    from test_rate_limit_redis import Redis
    redis = Redis(tmp_path)
    api = Named("127.0.0.2", "api")
    dns.set("redis.test", A, "127.0.0.1")
    dns.set("redis.test", AAAA)
    gw = start(build_dir, tmp_path, dns, limited_by_redis("redis.test", redis.port, api.port))
    try:
        got = answers(gw, 8)
        assert got == ["api"] * 5 + [429] * 3, got
        assert redis.evals() > 0
        assert dns.asked("redis.test")
    finally:
        gw.stop()
        api.stop()
        redis.stop()


def test_a_silent_dns_server_and_a_redis_name_hold_neither_reload_nor_sigterm(build_dir, tmp_path,
                                                                           dns):
    """With the Redis named and the DNS server silent, start, a reload storm and SIGTERM all
    end in their time: the limit fails closed (503) until the name has an address."""
    api = Named("127.0.0.2", "api")
    dns.silent = True
    began = time.monotonic()
    gw = start(build_dir, tmp_path, dns, limited_by_redis("redis.test", 6379, api.port),
               ", timeout: 2s", threads=2)
    try:
        assert time.monotonic() - began < 6
        assert wait_until(lambda: dns.asked("redis.test"), seconds=2)
        assert request(gw, "GET", "/")[0] == 503
        before = len(gw.errors)
        gw.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: any("reload (SIGHUP)" in line and "in force" in line
                                      for line in gw.errors[before:]), seconds=1.5)
        for _ in range(10):
            gw.proc.send_signal(signal.SIGHUP)
        stopping = time.monotonic()
        assert gw.stop(timeout=30) == 0
        assert time.monotonic() - stopping < 4, time.monotonic() - stopping
    finally:
        gw.stop()
        api.stop()


@pytest.mark.parametrize("name", ["alias.test", "localhost"])
def test_names_of_the_hosts_file_are_served_with_dns_silent(build_dir, tmp_path, dns, name):
    """A name the hosts file lists (c-ares reads $CARES_HOSTS in place of /etc/hosts; localhost
    is in /etc/hosts) is resolved from it by discovery, never asked of DNS (silent here), and
    neither start, a reload nor SIGTERM waits on it; an edit of the file is followed."""
    up = Named("127.0.0.1", "up")
    other = Named("127.0.0.2", "other")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 alias.test\n")
    env = {"CARES_HOSTS": str(hosts)} if name == "alias.test" else None
    dns.silent = True
    began = time.monotonic()
    gw = start(build_dir, tmp_path, dns, one_upstream(name, up.port), ", timeout: 3s", env=env)
    try:
        assert time.monotonic() - began < 3
        assert answers(gw, 4) == ["up"] * 4
        if name == "alias.test":
            # The file says another address now: the target follows (within min_ttl, 1 s).
            (tmp_path / "hosts.new").write_text(f"127.0.0.2 alias.test\n")
            (tmp_path / "hosts.new").rename(hosts)
            path = tmp_path / "gateway.yaml"
            path.write_text(path.read_text().replace(f"{name}:{up.port}", f"{name}:{other.port}"))
            gw.proc.send_signal(signal.SIGHUP)
            assert wait_until(lambda: answers(gw, 2) == ["other"] * 2, seconds=5)
        else:
            gw.proc.send_signal(signal.SIGHUP)
            assert logged(gw, "reload (SIGHUP)", "in force")
        assert not dns.asked(name)
        stopping = time.monotonic()
        assert gw.stop(timeout=30) == 0
        assert time.monotonic() - stopping < 2
    finally:
        gw.stop()
        up.stop()
        other.stop()
