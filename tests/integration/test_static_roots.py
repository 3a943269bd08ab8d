"""A static root is the folder its path names now, as nginx's root is (issue 70 item 7), and
nothing under it that is not a regular file is ever waited on (issue 67 item 11)."""
import os
import socket
import threading
import time

import h2.events
import h2.exceptions
import h2.settings
import pytest

from conftest import Server
from proxy_support import h2_connect, h2_events_until, request_headers, wait_until


def serve_root(build_dir, tmp_path, root):
    config = tmp_path / "site.yaml"
    config.write_text(f"servers:\n  - listen: 127.0.0.1:0\n    access_log: off\n"
                      f"    root: {root}\n")
    return Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(config),
                   "--threads", "1"])


def get(server, path):
    conn = server.connect()
    try:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := conn.sock.recv(65536):
            data += chunk
    finally:
        conn.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def swap(link, target):
    """Points `link` at `target` atomically, as deploy tools do (a new link renamed over it)."""
    tmp = link.with_name(link.name + ".next")
    os.symlink(target, tmp)
    os.replace(tmp, link)


def wait_for(server, path, body, within=5.0):
    """The status and body of `path` once it serves `body`, or its last answer after `within`."""
    end = time.monotonic() + within
    while True:
        answer = get(server, path)
        if answer == (200, body) or time.monotonic() > end:
            return answer
        time.sleep(0.05)


def test_a_symlink_swapped_deploy_is_served_without_a_reload(build_dir, tmp_path):
    releases = tmp_path / "releases"
    for n in (1, 2, 3):
        (releases / str(n)).mkdir(parents=True)
        (releases / str(n) / "index.html").write_text(f"release {n}")
    (releases / "2" / "added.css").write_text("body {}")
    current = tmp_path / "current"
    os.symlink(releases / "1", current)
    server = serve_root(build_dir, tmp_path, current)
    try:
        assert get(server, "/") == (200, b"release 1")
        assert get(server, "/added.css")[0] == 404
        swap(current, releases / "2")
        assert wait_for(server, "/", b"release 2") == (200, b"release 2")
        assert wait_for(server, "/added.css", b"body {}") == (200, b"body {}")
        # The old release deleted and the next one deployed: never 404 until a reload.
        for old in (releases / "1").iterdir():
            old.unlink()
        (releases / "1").rmdir()
        swap(current, releases / "3")
        assert wait_for(server, "/", b"release 3") == (200, b"release 3")
        assert wait_for(server, "/index.html", b"release 3") == (200, b"release 3")
    finally:
        assert server.stop() == 0


def test_a_fifo_under_the_root_is_not_found_and_holds_no_worker(build_dir, tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello")
    os.mkfifo(root / "feed.txt")
    os.mkfifo(root / "feed")
    server = serve_root(build_dir, tmp_path, root)
    try:
        answers = {}

        def ask(path):
            answers[path] = get(server, path)[0]

        # One worker: a GET that waited on the FIFO would hold every other request too.
        askers = [threading.Thread(target=ask, args=(p,)) for p in ("/feed.txt", "/feed")]
        for a in askers:
            a.start()
        for a in askers:
            a.join(timeout=10)
        assert answers == {"/feed.txt": 404, "/feed": 404}
        assert get(server, "/hello.txt") == (200, b"hello")
    finally:
        assert server.stop() == 0


# ---- static roots: what is not a regular file, a file that shrinks while sent ---------------


def static_server(build_dir, tmp_path, root):
    return serve_root(build_dir, tmp_path, root)


@pytest.mark.parametrize("where", ["index", "link", "outside"])
def test_a_fifo_behind_an_index_or_a_link_is_404_at_once(build_dir, tmp_path, where):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    os.mkfifo(tmp_path / "pipe")
    if where == "index":
        os.mkfifo(root / "d" / "index.html")
        path = "/d/"
    elif where == "link":
        os.mkfifo(root / "fifo")
        os.symlink("fifo", root / "d" / "x.html")
        path = "/d/x.html"
    else:  # a link out of the root (to a FIFO, as it happens): never followed
        os.symlink(tmp_path / "pipe", root / "d" / "x.html")
        path = "/d/x.html"
    (root / "ok.txt").write_text("ok")
    server = static_server(build_dir, tmp_path, root)
    try:
        start = time.monotonic()
        # (A folder whose index is no regular file has no index: 403, as one without.)
        assert get(server, path)[0] == (403 if where == "index" else 404)
        assert get(server, "/ok.txt") == (200, b"ok")
        assert time.monotonic() - start < 2.0
    finally:
        server.stop()


def test_a_file_that_shrinks_while_sent_over_http1_ends_its_connection(build_dir, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    big = root / "big.bin"
    big.write_bytes(b"b" * (16 << 20))
    (root / "ok.txt").write_text("ok")
    server = static_server(build_dir, tmp_path, root)
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(5)
        s.connect((server.host, server.port))
        s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        got = s.recv(65536)
        os.truncate(big, 1 << 20)
        start = time.monotonic()
        assert get(server, "/ok.txt") == (200, b"ok")
        assert time.monotonic() - start < 1.0
        while chunk := s.recv(65536):
            got += chunk
        s.close()
        assert len(got) < 16 << 20
    finally:
        server.stop()


def test_a_file_that_shrinks_while_sent_over_http2_resets_only_its_stream(build_dir, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    big = root / "big.bin"
    big.write_bytes(b"b" * (4 << 20))
    (root / "ok.txt").write_text("ok")
    config = tmp_path / "site.yaml"
    config.write_text(f"servers:\n  - listen: 127.0.0.1:0\n    access_log: off\n"
                      f"    http2: true\n    root: {root}\n")
    from conftest import Server
    server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                     str(config), "--threads", "1"])
    try:
        s, conn = h2_connect(server)
        with s:
            conn.send_headers(1, request_headers("/big.bin"), end_stream=True)
            s.sendall(conn.data_to_send())
            # The first window's worth (64 KiB), not acknowledged: the rest waits for room.
            h2_events_until(s, conn, lambda ev: sum(
                len(e.data) for e in ev if isinstance(e, h2.events.DataReceived)) >= 65535,
                seconds=5)
            os.truncate(big, 1000)
            conn.increment_flow_control_window(1 << 24)
            conn.increment_flow_control_window(1 << 24, stream_id=1)
            conn.send_headers(3, request_headers("/ok.txt"), end_stream=True)
            s.sendall(conn.data_to_send())
            events = h2_events_until(s, conn, lambda ev: any(
                isinstance(e, h2.events.StreamEnded) and e.stream_id == 3 for e in ev) and any(
                isinstance(e, (h2.events.StreamReset, h2.events.StreamEnded)) and
                e.stream_id == 1 for e in ev), seconds=5)
        assert any(isinstance(e, h2.events.StreamReset) and e.stream_id == 1 for e in events), \
            events
        assert b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived)
                        and e.stream_id == 3) == b"ok"
    finally:
        server.stop()


def test_a_static_root_swapped_to_a_fifo_is_404_at_once_and_back_served(build_dir, tmp_path):
    release = tmp_path / "release"
    release.mkdir()
    (release / "index.html").write_text("here")
    os.mkfifo(tmp_path / "pipe")
    current = tmp_path / "current"
    os.symlink(release, current)
    server = static_server(build_dir, tmp_path, current)
    try:
        assert get(server, "/") == (200, b"here")
        swap(current, tmp_path / "pipe")
        start = time.monotonic()
        assert wait_until(lambda: get(server, "/")[0] == 404, seconds=3)
        assert time.monotonic() - start < 3
        swap(current, release)
        assert wait_for(server, "/", b"here") == (200, b"here")
    finally:
        server.stop()
