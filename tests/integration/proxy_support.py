"""What the gateway tests share: upstreams and gateways started from a configuration text,
and small HTTP helpers."""
import http.client
import os
import socket
import time

from conftest import Server


def upstream(build_dir, name, keepalive_ms=None, tls=None, max_body=64 << 20, delay_ms=None):
    env = {"UPSTREAM_NAME": name}
    if delay_ms is not None:
        env["DELAY_MS"] = str(delay_ms)
    if keepalive_ms is not None:
        env["KEEPALIVE_MS"] = str(keepalive_ms)
    if tls is not None:
        env["TLS_CERT"], env["TLS_KEY"] = tls
    return Server([os.path.join(build_dir, "bin", "http_test_server"), "0", str(max_body), "1"],
                  env=env)


def gateway(build_dir, tmp_path, body, threads=2):
    config = tmp_path / "gateway.yaml"
    config.write_text(body)
    return Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(config),
                   "--threads", str(threads)])


def addr(server):
    return f"{server.host}:{server.port}"


def all_to(target):
    """Routes and services that send every request to `target`."""
    return f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: a}}
services:
  a: {{url: "http://{addr(target)}"}}
"""


def logged(server, *words, seconds=5):
    """Waits until a line of `server`'s log holds every one of `words` (its log is read by a
    thread, a moment after it is written); False if none did in time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(all(w in line for w in words) for line in list(server.errors)):
            return True
        time.sleep(0.02)
    return False


def request(server, method, path, body=None, headers=None, timeout=10, chunked=False):
    """One request on a new connection: status, fields (names without regard to case), body."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def response_head(s):
    """Reads a response head off socket `s`: the head, and the bytes that came after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = s.recv(4096)
        assert more, data
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER = """
servers:
  - name: public
    listen: 127.0.0.1:0
    http2: true
    access_log: off
    limits: {max_body: 4g}
"""
