"""The TechEmpower test types (build/bin/tfb) checked the way TechEmpower's verifier checks
them, by both roads to PostgreSQL (spindle's client, and blocking libpq through the hooks),
against a PostgreSQL these tests start (tests/tools/postgres.sh) with the TechEmpower schema.

Also counted from the server's side (pg_stat_statements): one statement per row asked, one
UPDATE per /updates request; and updates seen by a second connection.
"""
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request

import pytest

from conftest import ROOT, Server
from proxy_support import free_port

POSTGRES = os.path.join(ROOT, "tests", "tools", "postgres.sh")
SCHEMA = os.path.join(ROOT, "examples", "tfb", "schema.sql")
ROADS = ["native", "hooked"]


class Postgres:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="spindle-tfb-pg-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        out = subprocess.run([POSTGRES, "start", self.dir, str(free_port())],
                             capture_output=True, text=True)
        if out.returncode == 3:
            shutil.rmtree(self.dir, ignore_errors=True)
            pytest.skip("PostgreSQL is not installed (apt-get install postgresql; make test does)")
        assert out.returncode == 0, out.stderr
        self.conninfo = out.stdout.strip().splitlines()[-1]

    def sql(self, statement):
        """Runs `statement` with psql (a connection of its own); the rows, '|'-separated."""
        out = subprocess.run(["psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", self.conninfo,
                              "-c", statement], capture_output=True, text=True, check=True)
        return [line for line in out.stdout.splitlines() if line]

    def stop(self):
        subprocess.run([POSTGRES, "stop", self.dir], check=False)


@pytest.fixture(scope="module")
def postgres():
    server = Postgres()
    try:
        subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", server.conninfo,
                        "-f", SCHEMA], capture_output=True, text=True, check=True)
        server.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield server
    finally:
        server.stop()


@pytest.fixture(params=ROADS)
def tfb(request, build_dir, postgres):
    server = Server([os.path.join(build_dir, "bin", "tfb"), "--listen", "127.0.0.1:0", "--db",
                     postgres.conninfo, "--threads", "2", "--road", request.param])
    server.road = request.param
    yield server
    assert server.stop() == 0, "".join(server.errors)


def get(server, path):
    """(status, headers with lower-case names, body bytes)."""
    request = urllib.request.Request(f"http://{server.host}:{server.port}{path}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, \
                response.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def check_common(headers, body, content_type):
    assert headers["content-type"] == content_type
    assert headers["server"] == "spindle"
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", headers["date"])
    assert int(headers["content-length"]) == len(body)


def check_world(item):
    assert set(item) == {"id", "randomNumber"}
    assert type(item["id"]) is int and 1 <= item["id"] <= 10000
    assert type(item["randomNumber"]) is int and 1 <= item["randomNumber"] <= 10000


def test_json_and_plaintext(tfb):
    status, headers, body = get(tfb, "/json")
    assert status == 200
    check_common(headers, body, "application/json")
    assert json.loads(body) == {"message": "Hello, World!"}
    status, headers, body = get(tfb, "/plaintext")
    assert status == 200
    check_common(headers, body, "text/plain; charset=utf-8")
    assert body == b"Hello, World!"


def test_db_answers_a_row_as_the_database_holds_it(tfb, postgres):
    for _ in range(20):
        status, headers, body = get(tfb, "/db")
        assert status == 200
        check_common(headers, body, "application/json")
        item = json.loads(body)
        assert isinstance(item, dict)
        check_world(item)
        held = postgres.sql(f"SELECT randomnumber FROM world WHERE id = {item['id']}")
        assert int(held[0]) == item["randomNumber"]


@pytest.mark.parametrize("query,count", [
    ("queries=20", 20), ("queries=1", 1), ("queries=500", 500), ("queries=501", 500),
    ("queries=0", 1), ("queries=-5", 1), ("queries=foo", 1), ("queries=", 1), ("", 1),
    ("queries=99999999999999999999", 500), ("queries=7&x=1", 7), ("x=1&queries=3", 3),
])
def test_queries_are_clamped_to_1_through_500(tfb, query, count):
    status, headers, body = get(tfb, "/queries?" + query)
    assert status == 200
    check_common(headers, body, "application/json")
    items = json.loads(body)
    assert isinstance(items, list) and len(items) == count
    for item in items:
        check_world(item)


def test_fortunes_adds_one_sorts_and_escapes(tfb):
    status, headers, body = get(tfb, "/fortunes")
    assert status == 200
    check_common(headers, body, "text/html; charset=utf-8")
    text = body.decode("utf-8")  # UTF-8 intact, or this raises
    assert text.startswith("<!DOCTYPE html><html><head><title>Fortunes</title></head><body>"
                           "<table><tr><th>id</th><th>message</th></tr>")
    assert text.endswith("</table></body></html>")
    rows = re.findall(r"<tr><td>(\d+)</td><td>(.*?)</td></tr>", text)
    assert len(rows) == 13
    messages = [html.unescape(m) for _, m in rows]
    assert messages == sorted(messages)
    by_id = {int(i): m for i, m in rows}
    assert html.unescape(by_id[0]) == "Additional fortune added at request time."
    assert by_id[11] == ("&lt;script&gt;alert(&quot;This should not be displayed in a browser "
                         "alert box.&quot;);&lt;/script&gt;")
    assert by_id[12] == "フレームワークのベンチマーク"
    assert "<script>" not in text


def test_updates_are_persisted_and_seen_by_another_connection(tfb, postgres):
    for query, count in [("queries=20", 20), ("queries=1", 1), ("queries=foo", 1),
                         ("queries=501", 500)]:
        status, headers, body = get(tfb, "/updates?" + query)
        assert status == 200
        check_common(headers, body, "application/json")
        items = json.loads(body)
        assert len(items) == count
        latest = {}
        for item in items:
            check_world(item)
            # A row asked twice carries the one number it was set to.
            assert latest.setdefault(item["id"], item["randomNumber"]) == item["randomNumber"]
        ids = ",".join(str(i) for i in latest)
        held = dict(tuple(map(int, row.split("|")))
                    for row in postgres.sql(f"SELECT id, randomnumber FROM world WHERE id IN ({ids})"))
        assert held == latest


def test_cached_queries(tfb):
    for query, count in [("count=20", 20), ("count=0", 1), ("count=600", 500), ("count=x", 1)]:
        status, headers, body = get(tfb, "/cached-queries?" + query)
        assert status == 200
        check_common(headers, body, "application/json")
        items = json.loads(body)
        assert len(items) == count
        for item in items:
            check_world(item)


def statement_calls(postgres, pattern):
    rows = postgres.sql("SELECT query, calls FROM pg_stat_statements")
    return sum(int(row.rsplit("|", 1)[1]) for row in rows if re.search(pattern, row, re.I))


def test_the_server_runs_one_statement_per_row_asked(tfb, postgres):
    # Connections (and their prepares) first, so that the count is only the requests'.
    for path in ["/queries?queries=2", "/updates?queries=2", "/fortunes"]:
        assert get(tfb, path)[0] == 200
    postgres.sql("SELECT pg_stat_statements_reset()")
    for _ in range(5):
        assert get(tfb, "/queries?queries=20")[0] == 200
        assert get(tfb, "/db")[0] == 200
        assert get(tfb, "/updates?queries=10")[0] == 200
        assert get(tfb, "/fortunes")[0] == 200
    selects = statement_calls(postgres, r"^select id, randomnumber from world where id = \$1")
    updates = statement_calls(postgres, r"^update world set randomnumber = case id")
    fortunes = statement_calls(postgres, r"^select id, message from fortune")
    assert selects == 5 * (20 + 1 + 10)
    assert updates == 5
    assert fortunes == 5


def test_a_killed_backend_costs_its_calls_and_then_is_replaced(tfb, postgres):
    assert get(tfb, "/queries?queries=5")[0] == 200
    killed = postgres.sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                          "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
    killed = int(killed[0])
    assert killed >= 1
    # The kernel spreads connections over the two workers by a hash of the addresses, so a
    # worker's dead connection is met whenever a request first lands there: 40 requests, not
    # 12 (12 gave a worker no request before the last four once in a few hundred runs).
    statuses = [get(tfb, "/queries?queries=5")[0] for _ in range(40)]
    # What was on a killed connection fails (500), never hangs, once a connection at most;
    # then the pool has new ones.
    assert set(statuses) <= {200, 500}, statuses
    assert statuses.count(500) <= killed, statuses
    assert statuses[-4:] == [200] * 4, statuses


def test_bad_arguments_are_clear_errors(build_dir, postgres):
    binary = os.path.join(build_dir, "bin", "tfb")
    out = subprocess.run([binary, "--listen", "127.0.0.1:0"], capture_output=True, text=True)
    assert out.returncode == 2 and "--db CONNINFO is required" in out.stderr
    out = subprocess.run([binary, "--db", postgres.conninfo, "--road", "sideways"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--road is native or hooked" in out.stderr
    out = subprocess.run([binary, "--db", postgres.conninfo, "--threads", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "not a count" in out.stderr
    out = subprocess.run([binary, "--listen", "127.0.0.1:0", "--db",
                          postgres.conninfo + " dbname=nosuchdb"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 1 and "nosuchdb" in out.stderr


@pytest.mark.exclusive  # memcheck: the machine to itself
@pytest.mark.parametrize("road", ROADS)
def test_under_valgrind_no_error_and_everything_freed(build_dir, postgres, tmp_path, road):
    """Both roads under memcheck: every test type a few hundred times at 32 connections, a
    killed backend on the way, then SIGTERM: 0 errors, 0 bytes in use at exit."""
    from conftest import sanitizer_build
    if sanitizer_build(build_dir):
        pytest.skip("a sanitizer build cannot run under valgrind (the release build's run is "
                    "the valgrind check)")
    if shutil.which("valgrind") is None or shutil.which("h2load") is None:
        pytest.skip("valgrind or h2load is not installed (apt-get install valgrind "
                    "nghttp2-client): the valgrind check did not run")
    log = tmp_path / "valgrind.log"
    server = Server(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
                     "--errors-for-leak-kinds=all", f"--log-file={log}",
                     os.path.join(build_dir, "bin", "tfb"), "--listen", "127.0.0.1:0", "--db",
                     postgres.conninfo, "--threads", "2", "--road", road])
    try:
        for i, path in enumerate(["/db", "/queries?queries=20", "/fortunes", "/updates?queries=5",
                                  "/cached-queries?count=10"]):
            if i == 2:
                postgres.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                             "backend_type = 'client backend' AND pid <> pg_backend_pid() "
                             "AND application_name = ''")
            out = subprocess.run(["h2load", "--h1", "-n", "300", "-c", "32",
                                  f"http://127.0.0.1:{server.port}{path}"],
                                 capture_output=True, text=True, timeout=300)
            done = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored", out.stdout)
            assert done and int(done.group(1)) + int(done.group(2)) == 300, out.stdout
            if i != 2:  # right after the kill, the calls on killed connections fail
                assert int(done.group(1)) == 300, (path, out.stdout)
    finally:
        code = server.stop(timeout=120)
    report = log.read_text()
    assert code == 0, report[-3000:]
    assert "ERROR SUMMARY: 0 errors from 0 contexts" in report, report[-3000:]
    assert "in use at exit: 0 bytes in 0 blocks" in report, report[-3000:]
