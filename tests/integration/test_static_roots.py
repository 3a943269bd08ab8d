"""A static root is the folder its path names now, as nginx's root is (issue 70 item 7), and
nothing under it that is not a regular file is ever waited on (issue 67 item 11)."""
import os
import threading
import time

from conftest import Server


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
