"""Balancers over targets that DNS gives (docs/operations.md "DNS discovery"; docs/configuration.md
`balancer`, `targets`): consistent_hash keeps the keys of the targets that stay when a name
loses one of its addresses (was a defect: ring points hashed from a label that changed with the
name's address count) and moves keys only to a target joining an SRV name, whatever the weights
(was a defect: weights adding up past 256 rescaled the ring); SRV primaries whose names resolve
to nothing leave the backup serving; one primary down stays out, and the backup unused, across
the rebuilds another name's min_ttl brings; every balancer spreads over a name's A and AAAA
addresses. Against a DNS server of the test's own (dns_server.py)."""
import time

import pytest

from dns_server import A, AAAA, SRV, answers, dns_gateway, upstream_body
from proxy_support import request, wait_until
from test_dns_faults import Named


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


KEYS = [f"user{i}" for i in range(80)]


# ---- consistent_hash: a name's other address leaving moves an unrelated target's keys ------


def test_consistent_hash_keeps_unrelated_keys_when_a_name_loses_an_address(build_dir, tmp_path,
                                                                           dns):
    two = Named("127.0.0.2", "two")
    three = Named("127.0.0.3", "three", two.port)
    four = Named("127.0.0.4", "four", two.port)
    dns.set("a.test", A, "127.0.0.2", "127.0.0.3")
    dns.set("a.test", AAAA)
    dns.set("b.test", A, "127.0.0.4")
    dns.set("b.test", AAAA)
    gw = dns_gateway(build_dir, tmp_path, [dns.address],
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


# ---- consistent_hash: a target joining an SRV name moves only keys to itself --------------


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
    gw = dns_gateway(build_dir, tmp_path, [dns.address], upstream_body(srv=srv, balancer=HASHED),
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


# ---- SRV primaries that resolve to nothing: the backup serves -----------------------------


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
    gw = dns_gateway(build_dir, tmp_path, [dns.address], upstream_body(srv=srv), ", timeout: 500ms")
    try:
        assert answers(gw, 10) == ["b"] * 10
    finally:
        gw.stop()
        b.stop()


# ---- one primary down, rebuilds at every min_ttl: neither it nor the backup serves -------


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
    gw = dns_gateway(build_dir, tmp_path, [dns.address], body, ", srv_refresh: 1s, timeout: 1s")
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


# ---- every balancer over a name's A and AAAA addresses ------------------------------------


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
    gw = dns_gateway(build_dir, tmp_path, [dns.address], body)
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
