"""Where and when a name is looked up (docs/operations.md "DNS discovery" and "When things
fail"; docs/configuration.md `dns`, `redis`): a reload replacing a silent DNS server by a
working one is followed, lookups in flight on the old one asked again on the new (was a defect);
SIGTERM and SIGHUP during start's wait for the first answers are served at once (was a defect);
a Redis named in DNS and unresolved lets requests through with `failure_mode: open` and is never
connected to (was a defect: an uninitialised address), and follows its address on the TTL; the
hosts file answers first (a Redis, an SRV target, DNS silent), is followed when edited without a
reload, and one whose open blocks holds neither discovery nor SIGTERM (was a defect). One silent or
failing DNS server among two, a name flapping between answers and failures, a reload changing
the DNS settings, and a TCP fallback (after TC) that stalls or is cut never empty an upstream
within its grace: the last answer holds."""
import os
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from conftest import Server
from dns_server import A, AAAA, DnsServer, SRV, answers, config_text, dns_gateway, upstream_body
from proxy_support import (SERVER, free_port, logged, reload_and_wait, request, spindle_bin,
                           wait_until)
from test_dns_faults import Named, one_upstream


def in_force(gw, before):
    return wait_until(lambda: any("reload (SIGHUP)" in line and "in force" in line
                                  for line in gw.errors[before:]), seconds=8)


# ---- a reload that replaces a dead DNS server ---------------------------------------------


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
    gw = dns_gateway(build_dir, tmp_path, [old.address], body, keys)
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


# ---- signals while start waits for the first answers --------------------------------------


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


# ---- a Redis named in DNS, unresolved: failure_mode open lets requests through -----------


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
    gw = dns_gateway(build_dir, tmp_path, [dns.address],
                     redis_limited("redis.test", 6399, api.port, "open"), ", timeout: 500ms")
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
    gw = dns_gateway(build_dir, tmp_path, [dns.address],
                     redis_limited("redis.test", 6399, api.port, "closed"), ", timeout: 500ms")
    try:
        assert request(gw, "GET", "/")[0] == 503
        assert logged(gw, "redis", "cannot connect", seconds=3), gw.errors
        lines = [line for line in gw.errors if "redis" in line and "cannot connect" in line]
        assert all("refused" in line for line in lines), lines
    finally:
        gw.stop()
        api.stop()


# ---- a Redis named in the hosts file, DNS silent -------------------------------------------


def test_a_redis_named_in_the_hosts_file_is_used_with_dns_silent(build_dir, tmp_path, dns):
    from test_rate_limit_redis import Redis
    redis = Redis(tmp_path)
    api = Named("127.0.0.2", "api")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 store.test\n")
    dns.silent = True
    gw = dns_gateway(build_dir, tmp_path, [dns.address],
                     redis_limited("store.test", redis.port, api.port, "closed"),
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


# ---- the hosts file edited (no reload), then the name removed from it ---------------------


def test_a_hosts_file_edit_is_followed_without_a_reload_then_dns_takes_over(build_dir,
                                                                            tmp_path, dns):
    two = Named("127.0.0.2", "two")
    three = Named("127.0.0.3", "three", two.port)
    four = Named("127.0.0.4", "four", two.port)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 alias.test\n")
    dns.set("alias.test", A, "127.0.0.4")
    dns.set("alias.test", AAAA)
    gw = dns_gateway(build_dir, tmp_path, [dns.address], upstream_body([f"alias.test:{two.port}"]),
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


# ---- a hosts file that blocks its reader ---------------------------------------------------


def test_a_hosts_file_that_blocks_holds_neither_dns_nor_sigterm(build_dir, tmp_path, dns):
    one = Named("127.0.0.2", "one")
    fifo = tmp_path / "hosts"
    os.mkfifo(fifo)
    dns.set("a.test", A, "127.0.0.2")
    dns.set("a.test", AAAA)
    gw = dns_gateway(build_dir, tmp_path, [dns.address], upstream_body([f"a.test:{one.port}"]),
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


# ---- an SRV target named in the hosts file ------------------------------------------------


def test_an_srv_target_named_in_the_hosts_file_is_answered_from_it(build_dir, tmp_path, dns):
    a = Named("127.0.0.2", "a")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 local-a.test\n")
    srv = "_http._tcp.api.test"
    dns.set(srv, SRV, (10, 1, a.port, "local-a.test"))
    dns.fail("local-a.test", A, "silent")
    dns.fail("local-a.test", AAAA, "silent")
    gw = dns_gateway(build_dir, tmp_path, [dns.address], upstream_body(srv=srv), ", timeout: 2s",
                     env={"CARES_HOSTS": str(hosts)})
    try:
        assert answers(gw, 4) == ["a"] * 4
        assert not dns.asked("local-a.test")
    finally:
        gw.stop()
        a.stop()


# ---- a Redis named in DNS moves to another address ----------------------------------------


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
    gw = dns_gateway(build_dir, tmp_path, [dns.address], redis_limited("redis.test", first.port,
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
