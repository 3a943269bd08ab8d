"""mirror never changes what the primary sees (issue 70, item 1): on routes whose service reads
bodies whole up to its request_buffering and streams larger ones, every body size around both
bounds (request_buffering, and the 64 KiB a copy carries at most), with a Content-Length and
chunked (an HTTP/2 client's: without content-length), and one awaiting 100-continue, from
HTTP/1.1 and HTTP/2 clients, with a slow mirror target and with one that is down: the primary
upstream gets every request once with exactly the client's bytes. The copy carries the body
when the primary reads it whole and it fits; otherwise it is skipped, and counted in /metrics."""
import hashlib
import http.client
import json
import re

import pytest

from proxy_support import (RecordingUpstream, addr, free_port, gateway, h2_post, request,
                           wait_until)
from test_mirror import Shadow

COPY_LIMIT = 64 * 1024
# route prefix: the request_buffering of its service (bytes)
BUFFERING = {"/small": 1024, "/default": 64 * 1024, "/none": 0}


def sizes(bound):
    return sorted({n for b in (bound, COPY_LIMIT) for n in (b - 1, b, b + 1) if n > 0} | {1})


def body_of(n, seed):
    return hashlib.sha256(f"{seed}".encode()).digest() * (n // 32) + b"z" * (n % 32)


def copied(prefix, n, chunked):
    """Whether a copy carries this body (else it is skipped)."""
    return not chunked and n <= min(BUFFERING[prefix], COPY_LIMIT)


def mirror_config(target, shadow_port, log, admin):
    routes = "".join(f"""
  - name: r{prefix[1:]}
    match: {{path_prefix: {prefix}}}
    middlewares: [{{mirror: {{service: shadow, timeout: 10s}}}}]
    service: a{prefix[1:]}""" for prefix in BUFFERING)
    services = "".join(f"""
  a{prefix[1:]}: {{url: "http://{addr(target)}", request_buffering: {size}}}"""
                       for prefix, size in BUFFERING.items())
    return f"""
admin: {{listen: 127.0.0.1:{admin}}}
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: {{path: {log}, format: json}}
routes:{routes}
services:{services}
  shadow: {{url: "http://127.0.0.1:{shadow_port}", timeouts: {{first_byte: 10s}}}}
"""


def skipped_metric(admin):
    conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    found = re.search(r'^spindle_mirror_skipped_total\{service="shadow"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


@pytest.mark.parametrize("client", ["http1", "http2"])
@pytest.mark.parametrize("shadow_state", ["slow", "down"])
def test_the_primary_gets_every_body_whole_whatever_the_copy(build_dir, tmp_path, client,
                                                             shadow_state):
    primary = RecordingUpstream()
    shadow = Shadow(delay=0.5) if shadow_state == "slow" else None
    log, admin = tmp_path / "access.json", free_port()
    gw = gateway(build_dir, tmp_path, mirror_config(
        primary, shadow.port if shadow else free_port(), log, admin), threads=1)
    sent, marks = [], []
    try:
        for prefix, bound in BUFFERING.items():
            for n in sizes(bound):
                for chunked in (False, True):
                    path = f"{prefix}/{n}/{'chunked' if chunked else 'length'}"
                    body = body_of(n, path)
                    if client == "http1":
                        # (an iterable: http.client gives a bytes body a Content-Length)
                        status, _, _ = request(gw, "POST", path, chunked=chunked,
                                               body=iter([body]) if chunked else body)
                    else:
                        status, _ = h2_post(gw, path, body, length=not chunked)
                    assert status == 200, path
                    sent.append((path, hashlib.sha256(body).hexdigest()))
                    marks.append("sent" if copied(prefix, n, chunked) else "skipped")
            if client == "http1":
                # A body the client holds back for 100-continue is never waited for by a copy.
                path, body = f"{prefix}/continue", b"held back"
                status, _, _ = request(gw, "POST", path, body=body,
                                       headers={"Expect": "100-continue"})
                assert status == 200, path
                sent.append((path, hashlib.sha256(body).hexdigest()))
                marks.append("skipped")
        got = [(h.split(b" ")[1].decode(), hashlib.sha256(b).hexdigest())
               for h, b in primary.requests]
        assert got == sent  # each once, in order, with exactly the client's bytes
        def logged():
            lines = log.read_text().splitlines() if log.exists() else []
            return lines if len(lines) >= len(sent) else None
        lines = wait_until(logged)
        assert [json.loads(line).get("mirror") for line in lines] == marks
        assert skipped_metric(admin) == marks.count("skipped")
        if shadow:
            expected = sorted(s for s, m in zip(sent, marks) if m == "sent")
            assert wait_until(lambda: len(shadow.got) >= len(expected), seconds=20)
            assert sorted((p, hashlib.sha256(b).hexdigest())
                          for _, p, _, b in shadow.got) == expected
    finally:
        gw.stop()
        primary.stop()
        if shadow:
            shadow.stop()
