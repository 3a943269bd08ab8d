"""spindle's PostgreSQL client (pg/, in build/bin/tfb's native road, one worker) with Toxiproxy
between it and a real PostgreSQL, one case per toxic: latency, a bandwidth limit, a stall, a
reset of the connection when the answer comes, an answer cut short (limit_data) and a half-open
path. Each case states what the client of /updates (a read, then a write of the row read) sees
within --query-timeout, that the worker stays free (a probe's /json within 100 ms throughout),
and what reached the database: the UPDATEs PostgreSQL ran (pg_stat_statements), never one more
than the client asked. The gateway's parts are tests/integration/test_faults_gateway.py."""
import time
import urllib.error
import urllib.request

import pytest

from conftest import Server, sanitizer_build
from test_faults_gateway import PROBE_BOUND, Probe, toxi  # noqa: F401  (a fixture)
from test_pg_faults import tcp_port
from test_tfb import postgres  # noqa: F401  (the TechEmpower database, a fixture)

QUERY_TIMEOUT = 1.0  # tfb --query-timeout
UPDATE = "UPDATE world SET randomnumber = CASE id WHEN $1::int4 THEN $2::int4 ELSE%"

# By toxic: the toxics, then what /updates?queries=1 answers (its status, words of its body),
# the fewest and most seconds it takes, and the UPDATEs the database runs. Its read comes first:
# a fault that fails it leaves the write unsent.
NO_ANSWER = (b"the deadline passed after the statement was sent", QUERY_TIMEOUT - 0.05,
             QUERY_TIMEOUT + 0.5)
CLOSED = (b"server closed the connection unexpectedly", 0.0, 0.5)
CASES = {
    "latency": ([("latency", "downstream", {"latency": 300})], 200, b'"randomNumber"', 0.6, 1.5,
                1),
    "bandwidth": ([("bandwidth", "downstream", {"rate": 1})], 200, b'"randomNumber"', 0.0, 1.0,
                  1),
    "stall": ([("timeout", "downstream", {"timeout": 0})], 500, *NO_ANSWER, 0),
    "reset_answer": ([("reset_peer", "downstream", {"timeout": 0})], 500, *CLOSED, 0),
    "cut": ([("limit_data", "downstream", {"bytes": 10})], 500, *CLOSED, 0),
    "half_open": ([("timeout", "upstream", {"timeout": 0})], 500, *NO_ANSWER, 0),
}


def updates(server):
    """GET /updates?queries=1: (status, body, seconds taken)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{server.host}:{server.port}/updates?queries=1",
                                    timeout=10) as answer:
            body = answer.read()
            status = answer.status
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    return status, body, time.monotonic() - started


def updates_run(postgres):
    rows = postgres.sql(f"SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
                        f"WHERE query LIKE '{UPDATE}'")
    return int(rows[0])


@pytest.mark.parametrize("toxic", CASES)
def test_a_fault_on_the_path_to_postgresql(build_dir, postgres, toxi, toxic):
    toxics, status, says, low, high, writes = CASES[toxic]
    proxy = toxi.proxy(f"pg-{toxic}-{time.monotonic_ns()}",
                       f"127.0.0.1:{tcp_port(postgres.conninfo)}")
    conninfo = (f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres "
                "sslmode=disable connect_timeout=1")
    server = Server([f"{build_dir}/bin/tfb", "--listen", "127.0.0.1:0", "--db", conninfo,
                     "--threads", "1", "--connections", "1", "--road", "native",
                     "--query-timeout", str(int(QUERY_TIMEOUT))])
    try:
        assert updates(server)[0] == 200  # its connection is open
        before = updates_run(postgres)
        for kind, stream, attributes in toxics:
            proxy.add(kind, stream=stream, **attributes)
        slack = 0.5 if sanitizer_build(build_dir) else 0.0
        with Probe(server, "/json", b'{"message":"Hello, World!"}') as probe:
            got, body, seconds = updates(server)
            time.sleep(0.2)
        assert got == status and says in body, (got, body)
        assert low <= seconds <= high + slack, f"answered {got} in {seconds:.2f} s"
        assert not probe.failures, probe.failures
        assert probe.count >= 5
        assert probe.slowest < PROBE_BOUND, f"/json took {probe.slowest * 1000:.0f} ms"
        toxi.reset()  # (which closes the connections the toxics held)
        # Nothing written twice: the database ran the UPDATEs asked for and answered, no more.
        assert updates_run(postgres) - before == writes
        give_up = time.monotonic() + 5
        while updates(server)[0] != 200:
            assert time.monotonic() < give_up, list(server.errors)
            time.sleep(0.05)
    finally:
        proxy.delete()
        assert server.stop() == 0, "".join(server.errors)
