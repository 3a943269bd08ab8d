"""The configuration file watch loads only complete files: a file being written in place (a
writer holds it, modified and not closed yet) is never loaded, however long the writer pauses;
a rename into place, a ConfigMap's symlink swap and a symlink's target edited in place are
loaded; what is not a regular file (a FIFO, a device) or is empty is refused with the
configuration in force serving on, and never holds the main thread. A file deleted then written
again is loaded, a dangling symlink renamed over it is refused and followed later, writes racing
a reload storm leave the last complete version in force, and a SIGHUP while the file is written
in place loads no half file."""
import base64
import hashlib
import os
import signal
import threading
import time

import pytest

from conftest import Server
from proxy_support import addr, free_port, logged, request, spindle_bin, wait_until


def version(port, upstream, users, extra_route=""):
    """A configuration whose last route, /admin, needs credentials: its `middlewares` come
    after its `service`, so a file cut after that line is valid YAML without basic_auth."""
    return f"""servers:
  - name: public
    listen: 127.0.0.1:{port}
    access_log: off
services:
  s: {{url: "http://{upstream}"}}
routes:
{extra_route}  - name: open
    match: {{path_prefix: /open}}
    service: s
  - name: admin
    match: {{path_prefix: /admin}}
    service: s
    middlewares: [{{basic_auth: {{users_file: {users}}}}}]
"""


V2_ROUTE = """  - name: v2
    match: {path_prefix: /v2}
    middlewares: [{strip_prefix: /v2}]
    service: s
"""


@pytest.fixture
def site(build_dir, tmp_path, up):
    users = tmp_path / "users"
    sha = base64.b64encode(hashlib.sha1(b"secret").digest()).decode()
    users.write_text(f"admin:{{SHA}}{sha}\n")
    port = free_port()
    path = tmp_path / "gateway.yaml"
    v1 = version(port, addr(up), users)
    v2 = version(port, addr(up), users, V2_ROUTE)
    path.write_text(v1)
    gw = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(path),
                 "--threads", "2"])
    yield gw, path, v1, v2
    gw.stop()


def status(gw, target):
    return request(gw, "GET", target)[0]


def in_force(gw, v2):
    """Whether /v2 is routed (the second version is in force) as `v2` says."""
    return (status(gw, "/v2/headers") == 200) == v2


def cuts(text):
    """Where a writer may pause: after each line, and inside the admin route's lines."""
    points = [i + 1 for i, c in enumerate(text) if c == "\n"][:-1]
    admin = text.index("  - name: admin")
    points += [admin + 5, text.index("service: s", admin) + 4, text.index("middlewares", admin) + 9,
               len(text) - 10]
    return sorted(set(points))


def test_a_file_written_in_place_is_never_loaded_before_its_writer_closes_it(site):
    gw, path, v1, v2 = site
    assert status(gw, "/admin/x") == 401
    for cut in cuts(v2):
        with open(path, "w") as writer:
            writer.write(v2[:cut])
            writer.flush()
            os.fsync(writer.fileno())
            # Other events that may complete a version (its attributes changed, a file renamed
            # into the folder, as a ConfigMap's swap is) do not make this one complete.
            os.chmod(path, 0o640)
            unrelated = path.with_name("unrelated.tmp")
            unrelated.write_text("x")
            os.rename(unrelated, path.with_name("unrelated"))
            # Well past the settle time: the half file must never be served.
            until = time.monotonic() + 0.4
            while time.monotonic() < until:
                assert status(gw, "/admin/x") == 401, v2[:cut]
                assert in_force(gw, False), v2[:cut]
                time.sleep(0.02)
            writer.write(v2[cut:])
        assert wait_until(lambda: in_force(gw, True), seconds=5), (cut, gw.errors[-5:])
        assert status(gw, "/admin/x") == 401
        # Back to the first version, atomically, for the next cut.
        staged = path.with_name("staged.yaml")
        staged.write_text(v1)
        os.rename(staged, path)
        assert wait_until(lambda: in_force(gw, False), seconds=5), cut
    assert not logged(gw, "rejected", seconds=0.1)


def test_a_file_truncated_and_closed_is_refused_and_the_one_in_force_serves(site):
    gw, path, v1, v2 = site
    path.write_text("")
    assert logged(gw, "reload (file changed) rejected")
    assert status(gw, "/admin/x") == 401 and in_force(gw, False)
    path.write_text(v2)
    assert wait_until(lambda: in_force(gw, True))


def test_a_configmap_symlink_swap_and_an_edited_symlink_target_are_loaded(site, tmp_path):
    gw, path, v1, v2 = site
    # Kubernetes' layout: config -> ..data/config, ..data -> a timestamped folder, swapped by
    # renaming a new symlink over ..data.
    first = tmp_path / "..2024_01"
    first.mkdir()
    (first / "gateway.yaml").write_text(v2)
    os.symlink("..2024_01", tmp_path / "..data")
    staged = tmp_path / "staged"
    os.symlink("..data/gateway.yaml", staged)
    os.rename(staged, path)
    assert wait_until(lambda: in_force(gw, True))
    second = tmp_path / "..2024_02"
    second.mkdir()
    (second / "gateway.yaml").write_text(v1)
    os.symlink("..2024_02", tmp_path / "..data_tmp")
    os.rename(tmp_path / "..data_tmp", tmp_path / "..data")
    assert wait_until(lambda: in_force(gw, False))
    # The file replaced by a symlink to a file in another folder, then that file edited in
    # place: both are seen.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "real.yaml"
    target.write_text(v2)
    os.symlink(target, staged)
    os.rename(staged, path)
    assert wait_until(lambda: in_force(gw, True))
    target.write_text(v1)
    assert wait_until(lambda: in_force(gw, False))


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_what_is_not_a_configuration_is_refused_without_holding_the_main_thread(site, tmp_path,
                                                                                kind):
    """A FIFO (whose open would wait for a writer), a device (whose reads never end) or a file
    of 65 MiB (sparse) in the file's place: refused, and the main thread answers on."""
    gw, path, v1, v2 = site
    why = "larger than 64 MiB" if kind == "huge" else "not a regular file"
    staged = tmp_path / "staged"
    if kind == "fifo":
        os.mkfifo(tmp_path / "odd")
        os.symlink(tmp_path / "odd", staged)
    elif kind == "device":
        os.symlink("/dev/zero", staged)
    else:
        with open(staged, "w") as f:
            f.truncate(65 << 20)
    os.rename(staged, path)
    assert logged(gw, "reload (file changed) rejected", why)
    assert status(gw, "/admin/x") == 401
    # SIGHUP is refused the same way, and the main thread still answers signals.
    gw.proc.send_signal(signal.SIGHUP)
    assert logged(gw, "reload (SIGHUP) rejected", why)
    stopping = time.monotonic()
    assert gw.stop(timeout=20) == 0
    assert time.monotonic() - stopping < 5


# ---- the configuration file ---------------------------------------------------------------


def watched(port, up, route):
    return f"""servers:
  - {{listen: 127.0.0.1:{port}, access_log: off}}
routes:
  - {{name: {route}, match: {{path_prefix: /{route}/}}, middlewares: [{{strip_prefix: /{route}}}],
     service: s}}
services:
  s: {{url: "http://{addr(up)}"}}
"""


@pytest.fixture
def watched_site(build_dir, tmp_path, up):
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(watched(port, up, "one"))
    gw = Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads", "1"])
    yield gw, path, lambda route: watched(port, up, route)
    gw.stop()


def routed(gw, route):
    return request(gw, "GET", f"/{route}/plaintext")[0] == 200


def test_a_config_file_deleted_then_written_again_is_loaded(watched_site):
    gw, path, text = watched_site
    assert routed(gw, "one")
    os.unlink(path)
    time.sleep(0.5)
    assert routed(gw, "one")  # nothing to load: the one in force serves
    path.write_text(text("two"))
    assert wait_until(lambda: routed(gw, "two"), 5), gw.errors[-5:]
    # And the watch still follows it afterwards.
    path.write_text(text("three"))
    assert wait_until(lambda: routed(gw, "three"), 5), gw.errors[-5:]


def test_a_dangling_symlink_renamed_over_the_config_is_refused_and_followed_later(watched_site,
                                                                                 tmp_path):
    gw, path, text = watched_site
    staged = tmp_path / "staged"
    target = tmp_path / "later.yaml"
    os.symlink(target, staged)
    os.rename(staged, path)
    assert logged(gw, "rejected", seconds=5), gw.errors[-5:]
    assert routed(gw, "one")
    # The target appears (written elsewhere and renamed into place): loaded.
    (tmp_path / "later.tmp").write_text(text("two"))
    os.rename(tmp_path / "later.tmp", target)
    gw.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: routed(gw, "two"), 5), gw.errors[-5:]


def test_writes_racing_a_reload_storm_leave_the_last_complete_version_in_force(watched_site,
                                                                             tmp_path):
    """Versions renamed into place every few ms while SIGHUP comes as fast: afterwards the
    last version is in force (no reload loaded an older file after a newer one)."""
    gw, path, text = watched_site
    stop = [False]

    def signals():
        while not stop[0]:
            gw.proc.send_signal(signal.SIGHUP)
            time.sleep(0.003)
    t = threading.Thread(target=signals)
    t.start()
    try:
        for i in range(60):
            staged = tmp_path / f"v{i}.tmp"
            staged.write_text(text(f"v{i}"))
            os.rename(staged, path)
            time.sleep(0.01)
    finally:
        stop[0] = True
        t.join()
    assert wait_until(lambda: routed(gw, "v59"), 10), gw.errors[-5:]
    time.sleep(1)
    assert routed(gw, "v59") and not routed(gw, "v58")
    assert gw.proc.poll() is None


# ---- a SIGHUP while the file is being written in place ------------------------------------


def test_a_sighup_while_the_file_is_written_in_place_loads_no_half_file(build_dir, tmp_path, up):
    """A configuration tool rewrites the file in place while something (logrotate's
    postrotate, systemd's ExecReload, an operator) sends SIGHUP: the half written so far is
    valid YAML without the admin route's basic_auth. It must not be loaded."""
    import base64
    import hashlib
    users = tmp_path / "users"
    users.write_text("admin:{SHA}" + base64.b64encode(hashlib.sha1(b"secret").digest()).decode()
                     + "\n")
    port = free_port()
    path = tmp_path / "gateway.yaml"
    full = version(port, addr(up), users)
    path.write_text(full)
    gw = Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads", "1"])
    try:
        assert request(gw, "GET", "/admin/x")[0] == 401
        cut = full.index("    middlewares")
        with open(path, "w") as writer:
            writer.write(full[:cut])
            writer.flush()
            time.sleep(0.2)
            gw.proc.send_signal(signal.SIGHUP)
            until = time.monotonic() + 1.5
            statuses = set()
            while time.monotonic() < until:
                statuses.add(request(gw, "GET", "/admin/x")[0])
                time.sleep(0.05)
            assert logged(gw, "SIGHUP", "is being written")
            writer.write(full[cut:])
        assert statuses == {401}, f"the half file was loaded: /admin/x answered {statuses}"
        # The SIGHUP is not lost: once the writer closed the file, the reload it asked for runs.
        assert logged(gw, "SIGHUP", "in force", seconds=8)
        assert request(gw, "GET", "/admin/x")[0] == 401
    finally:
        gw.stop()
