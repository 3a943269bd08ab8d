"""The fields the gateway sends upstream: a client cannot strip the ones it adds (by naming them
in Connection); HTTP/2 cookies go up as one field, and a Host against :authority is refused."""
import re

import h2.events

from proxy_support import gateway, h2_connect, h2_events_until, one_route, raw, request_headers


def test_a_client_cannot_strip_the_fields_the_gateway_adds(build_dir, tmp_path, recorder):
    server = gateway(build_dir, tmp_path, one_route(recorder))
    try:
        named = ("X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host, Via, X-Request-Id, "
                 "traceparent, Forwarded")
        for upgrade in (True, False):
            fields = f"Upgrade: websocket\r\nConnection: upgrade, {named}\r\n" if upgrade else \
                f"Connection: keep-alive, {named}\r\n"
            got = raw(server, (f"GET /x HTTP/1.1\r\nHost: a.example\r\n{fields}"
                               "X-Forwarded-For: 6.6.6.6\r\nVia: 1.1 evil\r\n\r\n").encode(),
                      wait=2)
            assert got.startswith(b"HTTP/1.1 200"), got[:200]
            head = recorder.requests[-1][0].decode("latin-1").lower()
            for name in ("x-forwarded-for: 127.0.0.1\r", "x-forwarded-proto: http\r",
                         "x-forwarded-host: a.example\r", "via: 1.1 evil, 1.1 spindle\r",
                         "x-request-id: ", "traceparent: 00-"):
                assert name in head, (upgrade, name, head)
            assert "6.6.6.6" not in head, head  # an untrusted client's claim is dropped
            connection = re.findall(r"^connection: ([^\r]*)", head, re.M)
            assert connection in ([], ["upgrade"]), (upgrade, connection)
    finally:
        server.stop()


def test_http2_cookies_go_upstream_as_one_field_and_a_conflicting_host_is_refused(
        build_dir, tmp_path, recorder):
    server = gateway(build_dir, tmp_path, one_route(recorder))
    try:
        s, conn = h2_connect(server)
        conn.send_headers(1, request_headers("/c") + [("cookie", "a=1"), ("cookie", "b=2")],
                          end_stream=True)
        conn.send_headers(3, request_headers("/h") + [("host", "other.example")],
                          end_stream=True)
        s.sendall(conn.data_to_send())
        events = h2_events_until(s, conn, lambda ev: sum(
            isinstance(e, h2.events.StreamEnded) for e in ev) == 2)
        s.close()
        statuses = {e.stream_id: dict(e.headers)[b":status"] for e in events
                    if isinstance(e, h2.events.ResponseReceived)}
        assert statuses == {1: b"200", 3: b"400"}, statuses
        head = recorder.requests[-1][0].decode("latin-1")
        assert re.findall(r"^cookie: [^\r]*", head, re.M | re.I) == ["cookie: a=1; b=2"], head
        assert len(recorder.requests) == 1
    finally:
        server.stop()
