"""HTTPS: spindle serving HTTP/1.1 over TLS (ALPN, SNI, resumption, bad and stalled clients)."""
import os
import re
import socket
import ssl
import subprocess
import time

from conftest import Conn  # works on TLS sockets as on plain ones


def client_context(certs, alpn=("http/1.1",)):
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def tls_connect(server, certs, name="localhost", ctx=None, session=None):
    sock = socket.create_connection((server.host, server.port), timeout=5)
    return (ctx or client_context(certs)).wrap_socket(sock, server_hostname=name, session=session)


def get(path, host="localhost"):
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def test_https_keep_alive_and_alpn(tls_site, certs, http):
    with tls_connect(tls_site, certs) as s:
        assert s.selected_alpn_protocol() == "http/1.1"
        assert s.version() == "TLSv1.3"
        conn = Conn(s)
        for _ in range(20):
            s.sendall(get("/plaintext"))
            status, headers, body = http.read_response(conn)
            assert (status, body) == (200, b"Hello, World!") and "connection" not in headers
        # Pipelined requests over TLS come back in order too.
        s.sendall(get("/json") + get("/plaintext") + get("/nope"))
        assert [r[0] for r in http.read_responses(conn, 3)] == [200, 200, 404]


def test_pipelined_requests_spanning_many_records_are_all_answered(tls_site, certs, http):
    # 1,400 requests in four TLS records, each ending where a request ends, in one loopback
    # segment (corked: one readiness edge, nothing arriving later to wake the server again).
    # Each record leaves only complete requests in the server's buffer; the driver must see
    # that the socket and OpenSSL still hold more, rather than go idle and wait for an edge
    # that will not come (this test would then time out).
    with tls_connect(tls_site, certs) as s:
        conn = Conn(s)
        records = [b"".join(get("/plaintext" if i % 2 else "/json") for i in range(350))
                   for _ in range(4)]
        assert all(len(r) < 16384 for r in records) and sum(map(len, records)) < 60000
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        for record in records:
            s.sendall(record)  # one TLS record per call
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        statuses = [r[0] for r in http.read_responses(conn, 1400)]
        assert statuses == [200] * 1400
        # And the connection still serves what comes later, one at a time.
        for _ in range(3):
            s.sendall(get("/plaintext"))
            assert http.read_response(conn)[2] == b"Hello, World!"


def test_tls12_is_served_and_older_versions_are_refused(tls_site, certs, http):
    ctx = client_context(certs)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with tls_connect(tls_site, certs, ctx=ctx) as s:
        assert s.version() == "TLSv1.2"
        s.sendall(get("/plaintext"))
        assert http.read_response(Conn(s))[2] == b"Hello, World!"
    out = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{tls_site.port}",
                          "-tls1_1"], input=b"", capture_output=True, timeout=10)
    assert b"Cipher is (NONE)" in out.stdout or out.returncode != 0


def test_sni_picks_the_certificate_for_the_name(tls_site, certs):
    def subject(name):
        with tls_connect(tls_site, certs, name=name) as s:
            cert = s.getpeercert()
            return dict(x[0] for x in cert["subject"])["commonName"]
    assert subject("localhost") == "localhost"
    assert subject("api.other.test") == "other"  # verified against *.other.test


def test_sessions_resume(tls_site, certs, http):
    ctx = client_context(certs)
    with tls_connect(tls_site, certs, ctx=ctx) as s:
        s.sendall(get("/plaintext"))
        http.read_response(Conn(s))  # the TLS 1.3 ticket arrives with the first reads
        session = s.session
        assert not s.session_reused
    with tls_connect(tls_site, certs, ctx=ctx, session=session) as s:
        assert s.session_reused
        s.sendall(get("/plaintext"))
        assert http.read_response(Conn(s))[0] == 200


def test_a_large_static_file_arrives_intact_over_tls(tls_site, certs):
    out = subprocess.run(["curl", "-s", "--cacert", os.path.join(certs, "ca.pem"),
                          f"https://localhost:{tls_site.port}/big.bin"],
                         capture_output=True, timeout=30, check=True)
    assert out.stdout == bytes(range(256)) * 4096


def test_plain_http_to_the_tls_port_is_closed_at_once(tls_site):
    with socket.create_connection((tls_site.host, tls_site.port), timeout=5) as s:
        s.sendall(get("/plaintext"))
        start = time.monotonic()
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        assert time.monotonic() - start < 0.9  # not held until the handshake timeout
        assert b"HTTP/1.1" not in data


def test_stalled_handshakes_are_closed_after_the_timeout(tls_site, certs, http):
    # Each sends the start of a ClientHello record (announcing 512 bytes) and stalls. (A client
    # that sends nothing at all stays in the kernel's queue: TCP_DEFER_ACCEPT.)
    stalled = [socket.create_connection((tls_site.host, tls_site.port), timeout=5)
               for _ in range(20)]
    for s in stalled:
        s.sendall(b"\x16\x03\x01\x02\x00\x01")
    try:
        # The stalled clients hold no worker: a real client is served meanwhile.
        with tls_connect(tls_site, certs) as s:
            s.sendall(get("/plaintext"))
            assert http.read_response(Conn(s))[0] == 200
        start = time.monotonic()
        for s in stalled:
            s.settimeout(5)
            assert s.recv(1) == b""  # closed by the server
        assert time.monotonic() - start < 3
    finally:
        for s in stalled:
            s.close()


def test_tls_config_errors_name_the_key_and_file(build_dir, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("servers:\n  - listen: 127.0.0.1:0\n    tls:\n"
                      "      cert: missing.pem\n      key: missing.key\n")
    out = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config", str(config)],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 1
    assert re.search(r"bad\.yaml:\d+: servers\[0\]\.tls: \S*missing\.pem: No such file",
                     out.stderr), out.stderr
    config.write_text("servers:\n  - listen: 127.0.0.1:0\n    tls:\n      key: k.pem\n")
    out = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config", str(config)],
                         capture_output=True, text=True, timeout=10)
    assert "servers[0].tls.cert: required" in out.stderr
