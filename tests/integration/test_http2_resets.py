"""HTTP/2 streams reset by the client (Rapid Reset): reset streams are not forwarded, nor any
past GOAWAY; resets of running streams are budgeted, then GOAWAY with ENHANCE_YOUR_CALM."""
import re
import time

import h2.errors
import h2.events

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
