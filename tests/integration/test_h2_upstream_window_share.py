"""The send window of an HTTP/2 upstream connection, shared by a worker's clients (issue 68):
streams whose upstream handler reads its body only later never take it all. Each holds at
most what the connection has left (k such streams leave 1/2^k of it), so another client's
upload on the same connection goes through, from an HTTP/1.1 or an HTTP/2 client, while they
wait. The upstream is scripted (h2_raw.ScriptedUpstream) as Go's server behaves: 1 MiB
windows, each given back as its handler reads."""
import http.client
import random

import pytest

from h2_raw import INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS, Client, ScriptedUpstream
from h2_traffic import gateway_to


def later_and_now_upstream(connection_window=1 << 20, stream_window=1 << 20):
    """/later's handler reads nothing while the test runs; any other path's reads at once and
    answers "got N"."""
    def script(conn, sid):
        s = conn.stream(sid)
        conn.wait(lambda: s.done(), 60)
        if s.field(":path") != "/later":
            conn.answer(sid, 200, b"got %d" % len(s.body))

    return ScriptedUpstream(script, settings_pairs=((MAX_CONCURRENT_STREAMS, 1000),
                                                    (INITIAL_WINDOW_SIZE, stream_window)),
                            connection_window=connection_window,
                            gives_back=lambda conn, sid: conn.stream(sid).field(":path") != "/later")


def h2_post(port, body, seconds=15):
    """(status, body) of an HTTP/2 POST of `body` to /now on a new connection, sent within the
    gateway's windows (its streams' are 256 KiB: a larger body sent blindly is the client's
    flow-control error)."""
    c = Client(port)
    try:
        c.send(c.head(1, "/now", method="POST", end=False))
        assert c.upload(1, body, seconds=seconds), "the gateway's window stayed shut"
        s = c.wait_done(1, seconds)
        return s.status(), s.body
    finally:
        c.close()


def h1_post(port, body, seconds=15):
    """(status, body) of an HTTP/1.1 POST of `body` to /now on a new connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=seconds)
    try:
        conn.request("POST", "/now", body=body, headers={"Host": "gateway.test"})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


@pytest.mark.parametrize("victim", ["h1", "h2"])
@pytest.mark.parametrize("stalled", [1, 2, 3, 5])
def test_another_clients_upload_goes_through_while_uploads_wait_for_their_reader(
        build_dir, tmp_path, stalled, victim):
    rng = random.Random(stalled * 10 + len(victim))
    up = later_and_now_upstream(connection_window=rng.choice([1 << 20, 4 << 20]))
    gw = gateway_to(build_dir, tmp_path, up.port, ", limits: {max_body: 64m}")
    try:
        attackers = [Client(gw.port) for _ in range(rng.randint(1, stalled))]
        for i in range(stalled):
            a = attackers[i % len(attackers)]
            sid = 1 + 2 * (i // len(attackers))
            a.send(a.head(sid, "/later", method="POST", end=False))
            a.upload(sid, b"a" * 6_000_000, end=False, seconds=1)
        for round_ in range(2):
            size = rng.randint(1, 600_000)
            body = bytes(rng.getrandbits(8) for _ in range(64)) * (size // 64) + b"z" * (size % 64)
            if victim == "h2":
                got = h2_post(gw.port, body)
            else:
                got = h1_post(gw.port, body)
            assert got == (200, b"got %d" % len(body)), (round_, got)
        # Only one upstream connection carried them all.
        assert len(up.connections) == 1
        for a in attackers:
            a.close()
    finally:
        gw.stop()
        up.stop()
