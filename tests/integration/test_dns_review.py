"""An adversarial review of DNS discovery (docs/operations.md "DNS discovery" and "When things
fail"; docs/configuration.md `dns`, `redis`, `targets`, `balancer`): target names, SRV records
with priorities and weights, names of the hosts file, a Redis named in DNS, every balancer and
reloads, against a DNS server that is silent, fails, or changes its answers.

Each case is one attack. Those the gateway withstands are plain tests; those that found a
defect were xfail(strict=True), their reason the behaviour observed; each is fixed and a plain
test now ("was a defect" below):

1. consistent_hash, a name going from two addresses to one: keys of the targets that stay move
   (was a defect: ring points hashed from a label that changed with the name's address count).
2. consistent_hash, a target joining an SRV name: weights 1 hold; weights adding up past 256
   moved keys between the targets that stayed (was a defect: the ring was rescaled).
3. A reload replacing a silent DNS server by a working one, lookups overlapping on the old one
   (was a defect: the new server was never asked; lookups in flight are now asked again on it).
4. SIGHUP and SIGTERM during start's wait for the first answers (was a defect: served only after
   it); a SIGHUP alone then reloads once the process serves.
5. A Redis named in DNS, unresolved: `failure_mode: open` lets requests through (holds); the
   worker is refused without connecting (was a defect: it connected to an uninitialised Address).
6. A Redis named in the hosts file, DNS silent (holds).
7. A hosts file edited without a reload, then the name removed from it (holds).
8. A hosts file whose open blocks (was a defect: held all discovery and SIGTERM).
9. SRV primaries whose names resolve to nothing (NODATA, SERVFAIL): the backup serves (holds).
10. One of two SRV primaries down while an unrelated name rebuilds the gateway every min_ttl:
    the down one and the backup get nothing (holds).
11. Every balancer over a name's A and AAAA addresses (holds).
12. An SRV target named in the hosts file, DNS silent for it (holds).
13. A Redis named in DNS moving to another address (holds)."""
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import Server
from dns_server import AAAA, SRV, A, DnsServer
from proxy_support import SERVER, logged, request, wait_until
from test_dns_faults import Named


@pytest.fixture
def dns():
    server = DnsServer()
    yield server
    server.stop()


def config_text(dns_servers, body, dns_keys=""):
    servers = ", ".join(f'"{s}"' for s in dns_servers)
    return SERVER + f"dns: {{servers: [{servers}], min_ttl: 1s{dns_keys}}}\n" + body


def start(build_dir, tmp_path, dns_servers, body, dns_keys="", env=None):
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text(dns_servers, body, dns_keys))
    return Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                   "--threads", "1"], env=env)


def upstream_body(targets=None, srv=None, balancer="round_robin", health=""):
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


HASHED = "{consistent_hash: {by: header, key: x-user}}"
HEALTH = """    health:
      active: {path: /, interval: 100ms, timeout: 3s, healthy: 1, unhealthy: 1}
"""


def by_key(gw, keys):
    """key -> the name of the server that answered it (or the status)."""
    out = {}
    for key in keys:
        status, _, body = request(gw, "GET", "/", headers={"x-user": key})
        out[key] = body.decode() if status == 200 else status
    return out


def answers(gw, count):
    out = []
    for _ in range(count):
        status, _, body = request(gw, "GET", "/")
        out.append(body.decode() if status == 200 else status)
    return out


def in_force(gw, before):
    return wait_until(lambda: any("reload (SIGHUP)" in line and "in force" in line
                                  for line in gw.errors[before:]), seconds=8)


KEYS = [f"user{i}" for i in range(80)]


# ---- 1. consistent_hash: a name's other address leaving moves an unrelated target's keys ------

def test_consistent_hash_keeps_unrelated_keys_when_a_name_loses_an_address(build_dir, tmp_path,
                                                                           dns):
    two = Named("127.0.0.2", "two")
    three = Named("127.0.0.3", "three", two.port)
    four = Named("127.0.0.4", "four", two.port)
    dns.set("a.test", A, "127.0.0.2", "127.0.0.3")
    dns.set("a.test", AAAA)
    dns.set("b.test", A, "127.0.0.4")
    dns.set("b.test", AAAA)
    gw = start(build_dir, tmp_path, [dns.address],
               upstream_body([f"a.test:{two.port}", f"b.test:{two.port}"], balancer=HASHED))
    try:
        before = by_key(gw, KEYS)
        assert set(before.values()) == {"two", "three", "four"}, before
        dns.set("a.test", A, "127.0.0.2")
        assert wait_until(lambda: "three" not in by_key(gw, KEYS).values(), seconds=6)
        after = by_key(gw, KEYS)
        moved = {k: (before[k], after[k]) for k in KEYS
                 if before[k] != "three" and after[k] != before[k]}
        assert moved == {}, moved
    finally:
        gw.stop()
        for s in (two, three, four):
            s.stop()


# ---- 2. consistent_hash: a target joining an SRV name moves only keys to itself --------------

@pytest.mark.parametrize("weight", [1, 100])
def test_consistent_hash_moves_keys_only_to_a_joining_srv_target(build_dir, tmp_path, dns,
                                                                  weight):
    names = {"a": "127.0.0.2", "b": "127.0.0.3", "c": "127.0.0.4", "d": "127.0.0.5"}
    servers = {}
    for name, ip in names.items():
        servers[name] = Named(ip, name, servers["a"].port if servers else 0)
        dns.set(f"{name}.api.test", A, ip)
        dns.set(f"{name}.api.test", AAAA)
    port = servers["a"].port
    srv = "_http._tcp.api.test"
    dns.set(srv, SRV, *[(10, weight, port, f"{n}.api.test") for n in "abc"])
    gw = start(build_dir, tmp_path, [dns.address], upstream_body(srv=srv, balancer=HASHED),
               ", srv_refresh: 1s")
    try:
        before = by_key(gw, KEYS)
        assert set(before.values()) == {"a", "b", "c"}, before
        dns.set(srv, SRV, *[(10, weight, port, f"{n}.api.test") for n in "abcd"])
        assert wait_until(lambda: "d" in by_key(gw, KEYS).values(), seconds=6)
        after = by_key(gw, KEYS)
        moved = {k: (before[k], after[k]) for k in KEYS if after[k] not in (before[k], "d")}
        assert moved == {}, moved
        assert 5 <= list(after.values()).count("d") <= 40
    finally:
        gw.stop()
        for s in servers.values():
            s.stop()


# ---- 3. a reload that replaces a dead DNS server ---------------------------------------------

def test_a_reload_to_a_working_dns_server_is_followed_while_the_old_one_is_silent(
        build_dir, tmp_path, dns):
    # The old server answers the SRV name (one more target each second, up to four) and is
    # silent for the targets' names: their lookups start a second apart.
    old = DnsServer()
    one = Named("127.0.0.2", "one")
    srv = "_http._tcp.api.test"
    began = []

    def records():
        began.append(began[0] if began else time.monotonic())
        count = min(4, 1 + int(time.monotonic() - began[0]))
        return [(10, 1, one.port, f"h{i}.test") for i in range(count)]

    old.set(srv, SRV, records)
    dns.set(srv, SRV, (10, 1, one.port, "h0.test"))
    for i in range(4):
        old.fail(f"h{i}.test", A, "silent")
        old.fail(f"h{i}.test", AAAA, "silent")
        dns.set(f"h{i}.test", A, "127.0.0.2")
        dns.set(f"h{i}.test", AAAA)
    keys = ", srv_refresh: 1s, timeout: 3s"
    body = upstream_body(srv=srv)
    gw = start(build_dir, tmp_path, [old.address], body, keys)
    path = tmp_path / "gateway.yaml"
    try:
        assert wait_until(lambda: old.asked("h3.test"), seconds=8)
        # The operator points spindle at a DNS server that works.
        path.write_text(config_text([dns.address], body, keys))
        before = len(gw.errors)
        gw.proc.send_signal(signal.SIGHUP)
        assert in_force(gw, before)
        assert wait_until(lambda: dns.asked(), seconds=8), "the new server never asked"
        assert wait_until(lambda: answers(gw, 2) == ["one"] * 2, seconds=4)
    finally:
        gw.stop()
        one.stop()
        old.stop()


# ---- 4. signals while start waits for the first answers --------------------------------------

def test_sigterm_during_the_start_wait_for_names_ends_at_once(build_dir, tmp_path, dns):
    dns.silent = True
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text([dns.address], upstream_body(["a.test:80"]), ", timeout: 3s"))
    proc = subprocess.Popen([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                             str(path), "--threads", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: dns.asked("a.test"), seconds=3)
        proc.send_signal(signal.SIGHUP)  # a reload at any time: never the default (death)
        time.sleep(0.2)
        assert proc.poll() is None
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        took = time.monotonic() - stopping
        assert code == 0
        assert took < 1.5, took
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_sighup_during_the_start_wait_for_names_reloads_once_serving(build_dir, tmp_path,
                                                                         dns):
    """The SIGHUP read while start waits is not lost: once the process serves, it reloads the
    file (edited meanwhile), and the reload is in force."""
    dns.silent = True
    one = Named("127.0.0.2", "one")
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text([dns.address], upstream_body(["a.test:80"]), ", timeout: 1s"))
    log = open(tmp_path / "stderr", "wb")
    proc = subprocess.Popen([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                             str(path), "--threads", "1"], stdout=subprocess.DEVNULL,
                            stderr=log)
    try:
        assert wait_until(lambda: dns.asked("a.test"), seconds=3)
        path.write_text(config_text([dns.address], upstream_body([f"127.0.0.2:{one.port}"])))
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: b"reload (SIGHUP)" in (tmp_path / "stderr").read_bytes() and
                          b"in force" in (tmp_path / "stderr").read_bytes(), seconds=8)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        one.stop()


# ---- 5. a Redis named in DNS, unresolved: failure_mode open lets requests through -----------

def redis_limited(redis_host, redis_port, upstream_port, mode):
    return f"""
redis: {{address: "{redis_host}:{redis_port}", timeout: 200ms}}
routes:
  - name: all
    match: {{path_prefix: /}}
    middlewares:
      - rate_limit: {{key: route, rate: 1/s, burst: 3, store: redis, failure_mode: {mode}}}
    service: api
services:
  api: {{url: "http://127.0.0.2:{upstream_port}"}}
"""


def test_an_unresolved_redis_name_with_failure_mode_open_lets_requests_through(build_dir,
                                                                                tmp_path, dns):
    api = Named("127.0.0.2", "api")
    dns.fail("redis.test", A, "servfail")
    dns.fail("redis.test", AAAA, "servfail")
    gw = start(build_dir, tmp_path, [dns.address], redis_limited("redis.test", 6399, api.port,
                                                                 "open"), ", timeout: 500ms")
    try:
        assert answers(gw, 6) == ["api"] * 6
        assert dns.asked("redis.test")
    finally:
        gw.stop()
        api.stop()


def test_an_unresolved_redis_name_is_refused_not_connected_to(build_dir, tmp_path, dns):
    api = Named("127.0.0.2", "api")
    dns.fail("redis.test", A, "servfail")
    dns.fail("redis.test", AAAA, "servfail")
    gw = start(build_dir, tmp_path, [dns.address], redis_limited("redis.test", 6399, api.port,
                                                                 "closed"), ", timeout: 500ms")
    try:
        assert request(gw, "GET", "/")[0] == 503
        assert logged(gw, "redis", "cannot connect", seconds=3), gw.errors
        lines = [line for line in gw.errors if "redis" in line and "cannot connect" in line]
        assert all("refused" in line for line in lines), lines
    finally:
        gw.stop()
        api.stop()


# ---- 6. a Redis named in the hosts file, DNS silent -------------------------------------------

def test_a_redis_named_in_the_hosts_file_is_used_with_dns_silent(build_dir, tmp_path, dns):
    from test_rate_limit_redis import Redis
    redis = Redis(tmp_path)
    api = Named("127.0.0.2", "api")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 store.test\n")
    dns.silent = True
    gw = start(build_dir, tmp_path, [dns.address], redis_limited("store.test", redis.port,
                                                                 api.port, "closed"),
               ", timeout: 2s", env={"CARES_HOSTS": str(hosts)})
    try:
        got = answers(gw, 5)
        assert got == ["api"] * 3 + [429] * 2, got
        assert redis.evals() > 0
        assert not dns.asked("store.test")
    finally:
        gw.stop()
        api.stop()
        redis.stop()


# ---- 7. the hosts file edited (no reload), then the name removed from it ---------------------

def test_a_hosts_file_edit_is_followed_without_a_reload_then_dns_takes_over(build_dir,
                                                                            tmp_path, dns):
    two = Named("127.0.0.2", "two")
    three = Named("127.0.0.3", "three", two.port)
    four = Named("127.0.0.4", "four", two.port)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 alias.test\n")
    dns.set("alias.test", A, "127.0.0.4")
    dns.set("alias.test", AAAA)
    gw = start(build_dir, tmp_path, [dns.address], upstream_body([f"alias.test:{two.port}"]),
               ", timeout: 1s", env={"CARES_HOSTS": str(hosts)})
    try:
        assert answers(gw, 3) == ["two"] * 3
        assert not dns.asked("alias.test")
        (tmp_path / "hosts.new").write_text("127.0.0.3 alias.test\n")
        (tmp_path / "hosts.new").rename(hosts)
        assert wait_until(lambda: answers(gw, 3) == ["three"] * 3, seconds=5)
        # No longer listed: DNS's to answer.
        (tmp_path / "hosts.new").write_text("127.0.0.9 other.test\n")
        (tmp_path / "hosts.new").rename(hosts)
        assert wait_until(lambda: answers(gw, 3) == ["four"] * 3, seconds=5)
        assert dns.asked("alias.test")
    finally:
        gw.stop()
        for s in (two, three, four):
            s.stop()


# ---- 8. a hosts file that blocks its reader ---------------------------------------------------

def test_a_hosts_file_that_blocks_holds_neither_dns_nor_sigterm(build_dir, tmp_path, dns):
    one = Named("127.0.0.2", "one")
    fifo = tmp_path / "hosts"
    os.mkfifo(fifo)
    dns.set("a.test", A, "127.0.0.2")
    dns.set("a.test", AAAA)
    gw = start(build_dir, tmp_path, [dns.address], upstream_body([f"a.test:{one.port}"]),
               ", timeout: 500ms", env={"CARES_HOSTS": str(fifo)})
    try:
        served = wait_until(lambda: answers(gw, 1) == ["one"], seconds=3)
        stopping = time.monotonic()
        code = gw.stop(timeout=5)
        assert code == 0 and time.monotonic() - stopping < 2, (code, served)
        assert served
    finally:
        gw.stop(timeout=1)
        one.stop()


# ---- 9. SRV primaries that resolve to nothing: the backup serves -----------------------------

def test_srv_primaries_whose_names_resolve_to_nothing_leave_the_backup_serving(build_dir,
                                                                               tmp_path, dns):
    b = Named("127.0.0.3", "b")
    srv = "_http._tcp.api.test"
    dns.set(srv, SRV, (10, 1, b.port, "gone.api.test"), (10, 1, b.port, "broken.api.test"),
            (20, 1, b.port, "b.api.test"))
    dns.set("gone.api.test", SRV, (1, 1, 1, "x.test"))  # the name exists: A and AAAA NODATA
    dns.fail("broken.api.test", A, "servfail")
    dns.fail("broken.api.test", AAAA, "servfail")
    dns.set("b.api.test", A, "127.0.0.3")
    dns.set("b.api.test", AAAA)
    gw = start(build_dir, tmp_path, [dns.address], upstream_body(srv=srv), ", timeout: 500ms")
    try:
        assert answers(gw, 10) == ["b"] * 10
    finally:
        gw.stop()
        b.stop()


# ---- 10. one primary down, rebuilds at every min_ttl: neither it nor the backup serves -------

def test_a_down_primary_stays_out_and_backups_unused_across_dns_rebuilds(build_dir, tmp_path,
                                                                         dns):
    a, b, c = Named("127.0.0.2", "a"), Named("127.0.0.3", "b"), Named("127.0.0.4", "c")
    srv = "_http._tcp.api.test"
    dns.set(srv, SRV, (10, 1, a.port, "a.api.test"), (10, 1, b.port, "b.api.test"),
            (20, 1, c.port, "c.api.test"))
    dns.set("a.api.test", A, "127.0.0.2")
    dns.set("b.api.test", A, "127.0.0.3")
    dns.set("c.api.test", A, "127.0.0.4")
    # An unrelated name whose answer is new at every query (TTL 0): the gateway is built again
    # every min_ttl.
    counter = iter(range(10**6))
    dns.set("flap.test", A, lambda: [f"127.0.1.{next(counter) % 200 + 1}"], ttl=0)
    body = (upstream_body(srv=srv, health=HEALTH) +
            '  other: {targets: [{address: "flap.test:9"}]}\n')
    gw = start(build_dir, tmp_path, [dns.address], body, ", srv_refresh: 1s, timeout: 1s")
    try:
        a.up = False
        assert wait_until(lambda: set(answers(gw, 6)) == {"b"}, seconds=5)
        rebuilt = len([line for line in gw.errors if "dns: upstream other" in line])
        got = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            got += answers(gw, 5)
        assert set(got) == {"b"}, got
        assert len([line for line in gw.errors if "dns: upstream other" in line]) >= rebuilt + 2
    finally:
        gw.stop()
        for s in (a, b, c):
            s.stop()


# ---- 11. every balancer over a name's A and AAAA addresses ------------------------------------

def test_every_balancer_spreads_over_a_names_ipv4_and_ipv6_addresses(build_dir, tmp_path, dns):
    two = Named("127.0.0.2", "two")
    three = Named("127.0.0.3", "three", two.port)
    six = Named("::1", "six", two.port)
    dns.set("mix.test", A, "127.0.0.2", "127.0.0.3")
    dns.set("mix.test", AAAA, "::1")
    balancers = ["round_robin", "weighted", "least_connections", "random_two", HASHED]
    body = "routes:\n" + "".join(
        f"  - {{name: r{i}, match: {{path_prefix: /b{i}}}, service: s{i}}}\n"
        for i in range(len(balancers))) + "services:\n" + "".join(
        f"  s{i}: {{upstream: u{i}}}\n" for i in range(len(balancers))) + "upstreams:\n" + "".join(
        f"  u{i}: {{balancer: {b}, targets: [{{address: \"mix.test:{two.port}\"}}]}}\n"
        for i, b in enumerate(balancers))
    gw = start(build_dir, tmp_path, [dns.address], body)
    try:
        for i, balancer in enumerate(balancers):
            got = []
            for k in range(60):
                status, _, reply = request(gw, "GET", f"/b{i}", headers={"x-user": f"u{k}"})
                got.append(reply.decode() if status == 200 else status)
            assert set(got) == {"two", "three", "six"}, (balancer, got)
    finally:
        gw.stop()
        for s in (two, three, six):
            s.stop()


# ---- 12. an SRV target named in the hosts file ------------------------------------------------

def test_an_srv_target_named_in_the_hosts_file_is_answered_from_it(build_dir, tmp_path, dns):
    a = Named("127.0.0.2", "a")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 local-a.test\n")
    srv = "_http._tcp.api.test"
    dns.set(srv, SRV, (10, 1, a.port, "local-a.test"))
    dns.fail("local-a.test", A, "silent")
    dns.fail("local-a.test", AAAA, "silent")
    gw = start(build_dir, tmp_path, [dns.address], upstream_body(srv=srv), ", timeout: 2s",
               env={"CARES_HOSTS": str(hosts)})
    try:
        assert answers(gw, 4) == ["a"] * 4
        assert not dns.asked("local-a.test")
    finally:
        gw.stop()
        a.stop()


# ---- 13. a Redis named in DNS moves to another address ----------------------------------------

def redis_evals(host, port):
    """EVAL calls the Redis at host:port has answered (INFO commandstats)."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        data = b""
        while b"\r\n" not in data or len(data) < data.index(b"\r\n") + 2 + int(
                data[1:data.index(b"\r\n")]):
            more = s.recv(65536)
            if not more:
                break
            data += more
    for line in data.decode().splitlines():
        if line.startswith("cmdstat_eval:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def test_a_redis_named_in_dns_follows_its_address_on_the_ttl(build_dir, tmp_path, dns):
    from test_rate_limit_redis import Redis
    first = Redis(tmp_path)
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    second = subprocess.Popen(["redis-server", "--port", str(first.port), "--bind", "127.0.0.2",
                               "--save", "", "--appendonly", "no", "--dir", str(second_dir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = Named("127.0.0.2", "api")
    dns.set("redis.test", A, "127.0.0.1")
    dns.set("redis.test", AAAA)
    gw = start(build_dir, tmp_path, [dns.address], redis_limited("redis.test", first.port,
                                                                 api.port, "closed"))
    try:
        assert wait_until(lambda: _answers_redis("127.0.0.2", first.port), seconds=5)
        assert answers(gw, 4) == ["api"] * 3 + [429]
        assert first.evals() > 0
        dns.set("redis.test", A, "127.0.0.2")
        # The limit's counts now live in the second Redis (its own, fresh: 3 more let through).
        assert wait_until(lambda: answers(gw, 1) and redis_evals("127.0.0.2", first.port) > 0,
                          seconds=6)
    finally:
        gw.stop()
        api.stop()
        first.stop()
        second.terminate()
        second.wait()


def _answers_redis(host, port):
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False
