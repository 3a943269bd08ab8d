"""Retries: a POST that may have reached an upstream is never sent again."""
import socket
import struct
import time

from proxy_support import (POOL_ROUTE, RecordingUpstream, ScriptedUpstream, gateway, pool_config,
                           request)


class ResettingUpstream(ScriptedUpstream):
    """Reads a little of a request, then resets the connection (never reading the rest)."""

    def __init__(self):
        self.seen = 0
        super().__init__()

    def handle(self, conn):
        conn.recv(1024)
        self.seen += 1
        time.sleep(0.3)  # the gateway's socket buffers fill meanwhile
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()


def test_a_post_that_may_have_reached_an_upstream_is_never_sent_again(build_dir, tmp_path):
    first, second = ResettingUpstream(), RecordingUpstream()
    text = pool_config([first, second], POOL_ROUTE, servers_extra="    limits: {max_body: 64m}",
                  services_extra=", request_buffering: 16m",
                  upstream_extra="    balancer: round_robin")
    server = gateway(build_dir, tmp_path, text, threads=1)
    try:
        body = b"p" * (12 << 20)  # more than the kernel takes at once on loopback
        statuses = []
        while first.seen == 0 and len(statuses) < 6:  # round robin reaches `first` soon
            statuses.append(request(server, "POST", "/pay", body=body, timeout=30)[0])
        assert first.seen == 1
        posts = [h for h, _ in second.requests if h.startswith(b"POST")]
        # Each POST went to one target only: the one `first` cut part-way is a 502, not a
        # second POST to `second`.
        assert statuses[-1] == 502, statuses
        assert len(posts) == len(statuses) - 1, (statuses, len(posts))
    finally:
        server.stop()
        first.stop()
        second.stop()
