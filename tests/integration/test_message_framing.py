"""Message framing through the gateway: an upstream answer split across reads goes whole to its
own client, no request hidden in a body reaches the upstream, interim answers keep their reasons
and a status past 599 is a bad gateway. Each reproduced the way an adversarial run found it
(real sockets, an upstream that records every byte it receives, its writes split where the
attack splits them)."""
import re

from proxy_support import RecordingUpstream, gateway, one_route, raw, request


class SplittingUpstream(RecordingUpstream):
    """Answers with a long head cut in two writes, or a chunked body cut inside a chunk-size
    line, each with the client's own cookie."""

    def answer(self, head, body):
        who = re.search(rb"X-Who: (\w+)", head).group(1)
        if b"/chunked" in head.split(b"\r\n", 1)[0]:
            text = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nSet-Cookie: session=%s\r\n"
                    b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (who, len(who), who))
            cut = text.index(b"\r\n\r\n") + 5  # inside the chunk-size line
            return [text[:cut], text[cut:]]
        text = (b"HTTP/1.1 200 OK\r\nX-Pad: %s\r\nSet-Cookie: session=%s\r\nContent-Length: %d"
                b"\r\n\r\n%s" % (b"p" * 1800, who, len(who), who))
        return [text[:900], text[900:]]


def test_a_split_upstream_answer_goes_whole_to_its_own_client(build_dir, tmp_path):
    upstream = SplittingUpstream()
    server = gateway(build_dir, tmp_path, one_route(upstream), threads=1)
    try:
        for i in range(6):
            who = f"client{i}"
            path = "/chunked" if i % 2 == 0 else "/plain"
            status, fields, body = request(server, "GET", path, headers={"X-Who": who})
            assert status == 200, (i, status, body)
            assert body == who.encode(), (i, body)
            assert fields["Set-Cookie"] == f"session={who}", (i, fields)
        # Every answer came on one pooled connection: nothing was taken for a failure.
        assert upstream.accepted == 1
    finally:
        server.stop()
        upstream.stop()


def test_no_request_hidden_in_a_body_reaches_the_upstream(build_dir, tmp_path, recorder):
    # max_header_size 8k: a read buffer of 12 KiB, smaller than one 16 KiB body read. The
    # chunked body ends early in a read, so that more than 12 KiB of that read is left over.
    extra = "    limits: {max_header_size: 8k}\n"
    server = gateway(build_dir, tmp_path, one_route(recorder, extra_server=extra))
    try:
        hidden = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
        b_body = hidden + b"b" * 14000
        rest = (b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" %
                (len(b_body), b_body) + b"GET /c HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        for into_read in (300, 1000, 3000):
            head = b"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            # The first read fills the 12 KiB buffer, the next one 16 KiB; the chunked body ends
            # `into_read` bytes into the third.
            end = 12 * 1024 + 16 * 1024 + into_read
            size = end - len(head) - len(b"0000\r\n") - len(b"\r\n0\r\n\r\n")
            payload = b"c" * size
            chunked = head + b"%04x\r\n%s\r\n0\r\n\r\n" % (size, payload)
            assert len(chunked) == end
            before = len(recorder.requests)
            got = raw(server, chunked + rest)
            assert got.count(b"HTTP/1.1 200") == 3, got[:500]
            sent = recorder.requests[before:]
            assert [h.split(b"\r\n", 1)[0] for h, _ in sent] == [
                b"POST /chunked HTTP/1.1", b"POST /b HTTP/1.1", b"GET /c HTTP/1.1"], into_read
            assert sent[0][1] == payload and sent[1][1] == b_body, into_read
    finally:
        server.stop()


class OddStatusUpstream(RecordingUpstream):
    def answer(self, head, body):
        if b"/hints" in head:
            return (b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nno"


def test_interim_reasons_are_named_and_a_status_past_599_is_a_bad_gateway(build_dir, tmp_path):
    upstream = OddStatusUpstream()
    server = gateway(build_dir, tmp_path, one_route(upstream))
    try:
        got = raw(server, b"GET /hints HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 103 Early Hints\r\n"), got[:100]
        assert b"HTTP/1.1 200 OK" in got
        assert request(server, "GET", "/odd")[0] == 502
    finally:
        server.stop()
        upstream.stop()
