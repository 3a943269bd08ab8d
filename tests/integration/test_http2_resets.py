"""HTTP/2 streams reset by the client (Rapid Reset): reset streams are not forwarded, nor any
past GOAWAY; resets of running streams are budgeted, then GOAWAY with ENHANCE_YOUR_CALM."""
import re
import time

import h2.errors
import h2.events
import pytest

from h2_raw import (CONTINUATION, Client, ENHANCE_YOUR_CALM, HEADERS, INITIAL_WINDOW_SIZE,
                    PROTOCOL_ERROR, data, frame, ping, rst, settings)
from h2_traffic import Shared, goaway_code
from proxy_support import (RecordingUpstream, gateway, h2_connect, h2_events_until, one_route,
                           request_headers)


def forwarded_ids(upstream):
    return [int(m.group(1)) for t in upstream.targets() if (m := re.search(r"/r/(\d+)", t))]


def test_rapid_reset_streams_are_not_forwarded_nor_past_goaway(build_dir, tmp_path, recorder):
    server = gateway(build_dir, tmp_path, one_route(recorder), threads=1)
    try:
        s, conn = h2_connect(server)
        # 1,500 HEADERS + RST_STREAM pairs, 50 pairs a write, then 20 POSTs.
        for i in range(1500):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, request_headers(f"/r/{sid}"), end_stream=True)
            conn.reset_stream(sid)
            if i % 50 == 49:
                s.sendall(conn.data_to_send())
        posts = []
        for i in range(20):
            sid = conn.get_next_available_stream_id()
            posts.append(sid)
            conn.send_headers(sid, request_headers(f"/r/{sid}", "POST"))
            conn.send_data(sid, b"post", end_stream=True)
        try:
            s.sendall(conn.data_to_send())
        except OSError:
            pass
        # Read until the server closes (or 3 s): whatever it started has time to go upstream.
        events = h2_events_until(s, conn, lambda ev: False, seconds=3)
        s.close()
        goaway = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        last = goaway[0].last_stream_id if goaway else 2 ** 31
        time.sleep(0.5)
        ids = forwarded_ids(recorder)
        print(f"forwarded {len(ids)} of 1,520 streams; GOAWAY last id {last}")
        assert all(i <= last for i in ids), (last, [i for i in ids if i > last])
        reset_forwarded = [i for i in ids if i not in posts]
        # Reset in the same read as its HEADERS: never started. Only pairs cut by a read
        # boundary may have run.
        assert len(reset_forwarded) <= 8, reset_forwarded
    finally:
        server.stop()


class SlowUpstream(RecordingUpstream):
    def answer(self, head, body):
        time.sleep(1)
        return super().answer(head, body)


def test_resets_of_running_streams_are_budgeted_then_goaway_enhance_your_calm(build_dir,
                                                                                tmp_path):
    upstream = SlowUpstream()
    server = gateway(build_dir, tmp_path, one_route(upstream), threads=1)
    try:
        s, conn = h2_connect(server)
        h2_events_until(s, conn, lambda ev: any(
            isinstance(e, h2.events.RemoteSettingsChanged) for e in ev), seconds=2)
        sent = 0
        started = time.monotonic()
        for i in range(300):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, request_headers(f"/r/{sid}"), end_stream=True)
            try:
                s.sendall(conn.data_to_send())
                # Each HEADERS in a read of its own: its handler starts (the request reaches the
                # upstream), then it is reset.
                deadline = time.monotonic() + 2
                while sid not in forwarded_ids(upstream) and time.monotonic() < deadline:
                    time.sleep(0.002)
                conn.reset_stream(sid)
                s.sendall(conn.data_to_send())
            except OSError:
                break  # the server has closed: its last words are read below
            sent += 1
        events = h2_events_until(s, conn, lambda ev: any(
            isinstance(e, h2.events.ConnectionTerminated) for e in ev), seconds=5)
        s.close()
        found = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        terminated = found[0] if found else None
        print(f"{sent} resets of running streams sent; {len(forwarded_ids(upstream))} forwarded")
        assert terminated is not None, "no GOAWAY after 300 resets of running streams"
        assert terminated.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        # The budget is 100 resets of running streams at once, then 5 a second
        # (docs/configuration.md, running_reset_burst and running_resets_per_second): what a slow
        # run earns over its time is allowed too.
        earned = 5 * (time.monotonic() - started)
        assert len(forwarded_ids(upstream)) <= 120 + earned, (len(forwarded_ids(upstream)), earned)
    finally:
        server.stop()
        upstream.stop()


# ---- floods ------------------------------------------------------------------------------------


@pytest.mark.parametrize("flood", ["settings", "empty-data", "continuation", "empty-headers",
                                   "rst-of-reset"])
def test_floods_end_that_connection_only(shared, flood):
    shared.start_victim()
    c = Client(shared.port)
    assert c.get(1, "/bytes/1").ended
    if flood == "settings":
        c.send(*[settings((INITIAL_WINDOW_SIZE, 65535))] * 5000)
    elif flood == "empty-data":
        c.send(c.head(3, "/digest", method="POST", end=False), *[data(3, b"")] * 5000)
    elif flood == "continuation":
        c.send(frame(HEADERS, 0, 3, c.encode([(":method", "GET")])),
               *[frame(CONTINUATION, 0, 3, b"\x40\x01a\x01b")] * 20000)
    elif flood == "empty-headers":
        c.send(frame(HEADERS, 0, 3, b""), *[frame(CONTINUATION, 0, 3, b"")] * 5000)
    else:
        # Streams opened and reset at once, by the thousand (Rapid Reset).
        frames = []
        for i in range(3000):
            sid = 3 + 2 * i
            frames += [c.head(sid, "/bytes/100000"), rst(sid)]
        c.send(*frames)
    code = goaway_code(c, 20)
    assert code in (ENHANCE_YOUR_CALM, PROTOCOL_ERROR), (flood, c.goaway)
    shared.check_victim()


def test_a_ping_flood_from_a_client_that_reads_nothing_is_bounded(build_dir, tmp_path):
    """PINGs whose answers the client never reads (CVE-2019-9512): the gateway stops reading
    (or ends the connection once its unread output passes its bound), and ends the connection
    by its write timeout; everyone else goes on."""
    import socket
    from h2_raw import PREFACE
    shared = Shared(build_dir, tmp_path, server_extra=", timeouts: {write: 2s}")
    try:
        sock = socket.create_connection(("127.0.0.1", shared.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(20)
        sock.sendall(PREFACE + settings())
        closed = False
        # PINGs until the gateway ends the connection or stops reading (a send then blocks for
        # the socket's 20 s): bounded by time, not by a count, as a slow gateway's receive
        # buffer (up to tcp_rmem's 32 MiB) may take a whole count before it has read any.
        end = time.monotonic() + 60
        try:
            while time.monotonic() < end:
                sock.sendall(ping() * 2000)
        except OSError:
            closed = True  # reset by the gateway, or it stopped reading for 20 s
        sock.close()
        assert closed
        shared.check_victim()
    finally:
        shared.stop()


def test_rapid_reset_of_a_running_upload_costs_no_one_else(shared):
    shared.start_victim()
    c = Client(shared.port)
    for wave in range(5):
        frames = []
        for i in range(60):
            sid = 1 + 2 * (wave * 60 + i)
            frames += [c.head(sid, "/digest", method="POST", end=False), data(sid, b"x" * 1000)]
        c.send(*frames)
        time.sleep(0.1)
        c.send(*[rst(1 + 2 * (wave * 60 + i)) for i in range(60)])
    time.sleep(0.5)
    shared.check_victim()
