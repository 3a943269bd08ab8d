"""spindle's PostgreSQL client inside a real server (build/bin/tfb, the native road) with
Toxiproxy between it and PostgreSQL (tests/integration/toxiproxy.py): while the path to the
database stalls, the workers keep answering what needs no database, the requests waiting for
the database end once the path is cut, and the database answers again after. The client's own
fault tests are tests/unit/pg/faults_test.cc (issue 69)."""
import re
import threading
import time
import urllib.request

from conftest import Server
from test_tfb import get, postgres  # noqa: F401  (the TechEmpower database, a fixture)
from toxiproxy import toxiproxy  # noqa: F401  (the fixture)


def tcp_port(conninfo):
    return int(re.search(r"port=(\d+)", conninfo).group(1))


def test_a_stalled_database_path_holds_no_worker_and_heals(build_dir, postgres, toxiproxy):
    proxy = toxiproxy.proxy("pg", f"127.0.0.1:{tcp_port(postgres.conninfo)}")
    conninfo = f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres sslmode=disable"
    server = Server([f"{build_dir}/bin/tfb", "--listen", "127.0.0.1:0", "--db", conninfo,
                     "--threads", "2", "--road", "native"])
    try:
        for _ in range(10):
            assert get(server, "/db")[0] == 200
        stall = proxy.add("timeout", timeout=0)  # the server's answers are swallowed
        waiting = []

        def ask_db():
            started = time.monotonic()
            status = get(server, "/db")[0]
            waiting.append((status, time.monotonic() - started))

        # More at once than the one connection each worker opened so far: each opens another,
        # through the stalled path.
        askers = [threading.Thread(target=ask_db) for _ in range(8)]
        for a in askers:
            a.start()
        # Both workers have database calls waiting: what needs no database is answered at once.
        slowest = 0.0
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            started = time.monotonic()
            with urllib.request.urlopen(f"http://{server.host}:{server.port}/json", timeout=5) as r:
                assert r.status == 200
            slowest = max(slowest, time.monotonic() - started)
        # A worker held by a database call (a blocking open, a loop) holds /json for the whole
        # stall (1.5 s); one free answers in milliseconds, tens on a loaded machine. (Inside the
        # process, faults_test.cc's probes hold the workers to 100 ms.)
        assert slowest < 0.5, f"/json took {slowest * 1000:.0f} ms while the database stalled"
        assert not waiting, "a /db answered through a stalled path"
        cut = time.monotonic()
        proxy.remove(stall)  # which closes the stalled connections: their calls fail now
        for a in askers:
            a.join(timeout=10)
        assert len(waiting) == 8
        assert time.monotonic() - cut < 5
        assert {status for status, _ in waiting} <= {200, 500}
        # Healed: new connections, after the pause that follows a failed open.
        give_up = time.monotonic() + 5
        while get(server, "/db")[0] != 200:
            assert time.monotonic() < give_up, "the database did not answer again"
            time.sleep(0.05)
    finally:
        assert server.stop() == 0, "".join(server.errors)
