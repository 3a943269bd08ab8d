"""RFC 8441 extended CONNECT from HTTP/2 clients: a WebSocket over HTTP/2 echoes, a reset
tunnel costs its connection nothing, malformed extended CONNECTs (no :path, a GET naming a
:protocol) are refused, and tunnel data past the stream window resets only that tunnel."""
import pytest

from h2_raw import (CANCEL, Client, END_HEADERS, END_STREAM, FLOW_CONTROL_ERROR, HEADERS,
                    INITIAL_WINDOW_SIZE, data, frame, rst)
from proxy_support import gateway, one_route, upstream


# ---- RFC 8441 extended CONNECT ----------------------------------------------------------------


def websocket_gateway(build_dir, tmp_path):
    up = upstream(build_dir, "ws", env={"KEEPALIVE_MS": "60000"})
    gw = gateway(build_dir, tmp_path, one_route(up), threads=1)
    return up, gw


def ws_head(c, sid, extra=(), end=False, path="/ws"):
    fields = [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
              (":authority", "gateway.test"), (":path", path),
              ("sec-websocket-version", "13"), *extra]
    return frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, c.encode(fields))


def test_a_websocket_over_http2_echoes_and_a_reset_tunnel_costs_the_connection_nothing(
        build_dir, tmp_path):
    up, gw = websocket_gateway(build_dir, tmp_path)
    try:
        c = Client(gw.port)
        c.send(ws_head(c, 1))
        c.wait(lambda: c.stream(1).heads or c.stream(1).done())
        assert c.stream(1).status() == 200, (c.stream(1).heads, c.stream(1).reset)
        c.send(data(1, b"hello"))
        assert c.wait(lambda: c.stream(1).body == b"hello")
        # A second tunnel and a plain request share the connection; the first is reset.
        c.send(ws_head(c, 3))
        c.wait(lambda: c.stream(3).heads)
        c.send(rst(1, CANCEL), data(3, b"three"))
        assert c.wait(lambda: c.stream(3).body == b"three")
        assert c.get(5, "/plaintext").status() == 200
        c.send(data(3, b"", end=True))
        assert c.wait_done(3).ended or c.stream(3).reset is not None
        assert c.goaway is None
    finally:
        gw.stop()
        up.stop()


@pytest.mark.parametrize("case", ["no-path", "get-with-protocol"])
def test_malformed_extended_connects_are_refused(build_dir, tmp_path, case):
    up, gw = websocket_gateway(build_dir, tmp_path)
    try:
        c = Client(gw.port)
        if case == "end-stream":
            c.send(ws_head(c, 1, end=True))
        elif case == "no-path":
            c.send(frame(HEADERS, END_HEADERS, 1, c.encode([
                (":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "http"),
                (":authority", "gateway.test")])))
        elif case == "get-with-protocol":
            c.send(frame(HEADERS, END_HEADERS, 1, c.encode([
                (":method", "GET"), (":protocol", "websocket"), (":scheme", "http"),
                (":authority", "gateway.test"), (":path", "/ws")])))
        else:
            c.send(ws_head(c, 1, extra=[("content-length", "5")]))
        s = c.wait_done(1, 5)
        # Never a 200 that the client takes for a tunnel.
        assert s.status() != 200, (case, s.heads)
        assert s.reset is not None or s.status() >= 400, (case, s.heads, s.reset)
        assert c.get(3, "/plaintext").status() == 200
    finally:
        gw.stop()
        up.stop()


def test_tunnel_data_past_the_stream_window_resets_only_the_tunnel(build_dir, tmp_path):
    """The client's tunnel window opens only as the upstream takes the bytes; a client that
    sends past it (while its peer does not read the echo) gets its stream reset."""
    up, gw = websocket_gateway(build_dir, tmp_path)
    try:
        c = Client(gw.port, settings_pairs=[(INITIAL_WINDOW_SIZE, 0)], auto_window=False)
        c.send(ws_head(c, 1))
        c.wait(lambda: c.stream(1).heads)
        for _ in range(200):  # 3.2 MB, never reading the echo
            if not c.send(data(1, b"z" * 16384)):
                break
        s = c.wait_done(1, 20)
        assert s.reset == FLOW_CONTROL_ERROR, s.reset
        assert c.goaway is None
    finally:
        gw.stop()
        up.stop()
