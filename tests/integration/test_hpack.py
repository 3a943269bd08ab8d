"""HPACK through the gateway (RFC 7541): a table size of zero then more, from a client or an
upstream, is followed by the gateway's encoder; credentials go never-indexed both ways and no
client's value enters a table another client's stream reads; what an upstream sent never indexed
(head, interim answer, trailers) reaches the client so; an HPACK bomb costs its stream only."""
import time

import pytest

from h2_raw import (Client, END_HEADERS, END_STREAM, HEADERS, HEADER_TABLE_SIZE,
                    MAX_CONCURRENT_STREAMS, ScriptedUpstream, data, frame, settings)
from h2_traffic import gateway_to


# ---- HPACK ------------------------------------------------------------------------------------


def test_a_client_table_size_of_zero_then_more_is_followed_by_the_gateways_encoder(shared):
    """SETTINGS_HEADER_TABLE_SIZE 0: no response block may add to the client's table (a size
    update to 0 first); later 4096 again, then 64: each block decodes against the size said."""
    c = Client(shared.port, settings_pairs=[(HEADER_TABLE_SIZE, 0)])
    c.decoder.max_allowed_table_size = 0
    c.decoder.header_table_size = 0  # (what the decoder assumes we acknowledged)
    for sid in (1, 3):
        s = c.get(sid, "/bytes/10")
        assert s.status() == 200 and c.error is None, c.error
        assert len(c.decoder.header_table.dynamic_entries) == 0
    c.send(settings((HEADER_TABLE_SIZE, 4096)))
    c.decoder.max_allowed_table_size = 4096
    time.sleep(0.2)
    for sid in (5, 7):
        assert c.get(sid, "/bytes/10").status() == 200 and c.error is None, c.error
    c.send(settings((HEADER_TABLE_SIZE, 64)))
    time.sleep(0.2)
    c.decoder.max_allowed_table_size = 64
    for sid in (9, 11):
        s = c.get(sid, "/bytes/10")
        assert s.status() == 200 and c.error is None, c.error
        assert c.decoder.header_table.maxsize <= 64
    shared.check_victim()


def test_credentials_go_never_indexed_both_ways_and_no_value_enters_the_shared_table(
        build_dir, tmp_path):
    """A client sends its credentials with incremental indexing (as h2 clients do), and the
    upstream its Set-Cookie so: each goes on never indexed, and the upstream's table of the
    shared connection holds no credential."""
    seen = []

    def script(conn, sid):
        s = conn.stream(sid)
        seen.append({n: never for n, _, never in s.heads[0]})
        conn.answer(sid, 200, b"ok", fields=[("set-cookie", "sid=upstream-secret"),
                                             ("x-plain", "v")])

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        for who in ("alice", "bobby"):
            c = Client(gw.port)
            s = c.get(1, "/x", extra=[("authorization", f"Bearer {who}-token"),
                                      ("x-api-key", f"{who}-key"),
                                      ("proxy-authorization", f"Basic {who}")])
            assert s.status() == 200
            assert s.never_indexed("set-cookie"), s.heads
            c.close()
        for fields in seen:
            for name in ("authorization", "x-api-key"):
                assert fields.get(name) is True, fields
            assert "proxy-authorization" not in fields or fields["proxy-authorization"]
        table = " ".join(bytes(v).decode()
                         for _, v in up.connections[0].decoder.header_table.dynamic_entries)
        for secret in ("alice", "bobby"):
            assert secret not in table, table
    finally:
        gw.stop()
        up.stop()


def test_an_hpack_bomb_costs_its_stream_and_the_connection_goes_on(shared):
    shared.start_victim()
    c = Client(shared.port)
    big = "b" * 2000
    # One 2 KB entry in the table, then a block that names it 400 times (800 KB decoded).
    first = c.encode([(":method", "GET"), (":scheme", "http"), (":authority", "a"),
                      (":path", "/bytes/1"), ("x-bomb", big)])
    c.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, first))
    assert c.wait_done(1).status() == 200
    index = bytes([0x80 | 62])  # the newest dynamic entry: x-bomb
    block = c.encode([(":method", "GET"), (":scheme", "http"), (":authority", "a"),
                      (":path", "/bytes/1")]) + index * 400
    c.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, block))
    s = c.wait_done(3)
    assert s.status() == 431 or s.reset is not None, (s.status(), s.reset)
    assert c.get(5, "/bytes/10").status() == 200
    shared.check_victim()


def test_an_upstream_table_size_of_zero_is_followed_by_the_gateways_encoder(build_dir,
                                                                           tmp_path):
    """The upstream's SETTINGS_HEADER_TABLE_SIZE 0: no block on the shared connection adds to
    its table (an entry added would be lost, and a later reference to it undecodable)."""
    def script(conn, sid):
        conn.answer(sid, 200, b"ok")

    up = ScriptedUpstream(script, settings_pairs=((MAX_CONCURRENT_STREAMS, 100),
                                                  (HEADER_TABLE_SIZE, 0)))
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        c = Client(gw.port)
        c.get(1, "/first")  # the connection made, SETTINGS exchanged
        conn = up.connections[0]
        conn.decoder.max_allowed_table_size = 0
        conn.decoder.header_table_size = 0
        for sid in range(3, 23, 2):
            s = c.get(sid, "/again", extra=[("accept", "text/html"),
                                            ("accept-language", "fr"),
                                            ("content-type", "text/plain")])
            assert s.status() == 200, (sid, s.status(), s.reset)
        assert conn.error is None and not conn.closed, conn.error
        assert len(conn.decoder.header_table.dynamic_entries) == 0
    finally:
        gw.stop()
        up.stop()


@pytest.mark.parametrize("where", ["head", "interim", "trailers"])
def test_an_upstream_field_sent_never_indexed_reaches_the_client_never_indexed(build_dir,
                                                                            tmp_path, where):
    """RFC 7541 §6.2.3: an intermediary passes a never-indexed field on as one; the docs say
    a message with one goes on never indexed whole. In a final head, a 103's, or trailers."""
    def script(conn, sid):
        secret = [("x-secret", "s3cret")]
        if where == "interim":
            conn.send(frame(HEADERS, END_HEADERS, sid, conn.encode(
                [(":status", "103"), ("link", "</a.css>"), *secret], sensitive=("x-secret",))))
            conn.answer(sid, 200, b"ok")
        elif where == "trailers":
            conn.send(frame(HEADERS, END_HEADERS, sid, conn.encode([(":status", "200")])),
                      data(sid, b"ok"),
                      frame(HEADERS, END_HEADERS | END_STREAM, sid,
                            conn.encode([("grpc-status", "0"), *secret],
                                        sensitive=("x-secret",))))
        else:
            conn.answer(sid, 200, b"ok", fields=secret, sensitive=("x-secret",))

    up = ScriptedUpstream(script)
    gw = gateway_to(build_dir, tmp_path, up.port)
    try:
        c = Client(gw.port)
        s = c.get(1, "/x", extra=[("te", "trailers")])
        assert s.status() == 200 and s.ended
        assert s.field("x-secret") == "s3cret", s.heads
        assert s.never_indexed("x-secret"), s.heads
    finally:
        gw.stop()
        up.stop()
