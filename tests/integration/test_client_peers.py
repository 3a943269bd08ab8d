"""spindle's HttpClient (examples/fetch) against nginx and h2o as real HTTP/2 + TLS servers."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from proxy_support import free_port


def wait_listening(proc, *ports):
    deadline = time.time() + 10
    for port in ports:
        while True:
            assert proc.poll() is None, f"the peer exited with {proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.time() < deadline, f"nothing listens on {port}"
                time.sleep(0.05)


def need(tool):
    if not shutil.which(tool):
        pytest.fail(f"{tool} is not installed (scripts/install-deps.sh test installs it)")


@pytest.fixture
def site():
    """A document root readable by h2o's unprivileged workers (pytest's own temporary folders
    are private to root): a small and a 2 MiB file."""
    root = tempfile.mkdtemp(prefix="spindle-peer-")
    os.chmod(root, 0o755)
    with open(os.path.join(root, "small.txt"), "w") as f:
        f.write("hello from a peer\n")
    with open(os.path.join(root, "big.bin"), "wb") as f:
        f.write(bytes(range(256)) * 8192)
    yield root
    shutil.rmtree(root)


def start(argv):
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def nginx(tmp_path, site, certs):
    need("nginx")
    tls_port, plain_port = free_port(), free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"""daemon off; master_process off; worker_processes 1;
pid {tmp_path}/nginx.pid; error_log {tmp_path}/nginx-error.log;
events {{}}
http {{
  access_log off;
  client_body_temp_path {tmp_path}; proxy_temp_path {tmp_path}; fastcgi_temp_path {tmp_path};
  uwsgi_temp_path {tmp_path}; scgi_temp_path {tmp_path};
  server {{
    listen 127.0.0.1:{tls_port} ssl http2;
    listen 127.0.0.1:{plain_port};
    ssl_certificate {certs}/localhost.pem; ssl_certificate_key {certs}/localhost.key;
    location / {{ root {site}; }}
  }}
}}
""")
    proc = start(["nginx", "-c", str(conf), "-p", str(tmp_path)])
    wait_listening(proc, tls_port, plain_port)
    yield tls_port, plain_port
    stop(proc)


@pytest.fixture
def h2o(tmp_path, site, certs):
    need("h2o")
    tls_port, plain_port = free_port(), free_port()
    for name in ("localhost.pem", "localhost.key"):  # readable by h2o's workers
        shutil.copy(os.path.join(certs, name), tmp_path / name)
        os.chmod(tmp_path / name, 0o644)
    conf = tmp_path / "h2o.conf"
    conf.write_text(f"""num-threads: 1
listen:
  host: 127.0.0.1
  port: {tls_port}
  ssl:
    certificate-file: {tmp_path}/localhost.pem
    key-file: {tmp_path}/localhost.key
listen:
  host: 127.0.0.1
  port: {plain_port}
hosts:
  default:
    paths:
      /:
        file.dir: {site}
""")
    proc = start(["h2o", "-c", str(conf)])
    wait_listening(proc, tls_port, plain_port)
    yield tls_port, plain_port
    stop(proc)


def fetch(build_dir, url, *flags):
    out = subprocess.run([os.path.join(build_dir, "bin", "fetch"), *flags, url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("peer", ["nginx", "h2o"])
def test_client_speaks_h2_over_tls_to_real_servers(request, build_dir, certs, peer):
    tls_port, plain_port = request.getfixturevalue(peer)
    ca = ["--ca", os.path.join(certs, "ca.pem")]
    small = fetch(build_dir, f"https://localhost:{tls_port}/small.txt", *ca)
    assert (small["status"], small["version"], small["bytes"]) == (200, 20, 18)
    # 20 fibers at once, multiplexed on one HTTP/2 connection; 2 MiB each, flow-controlled.
    big = fetch(build_dir, f"https://localhost:{tls_port}/big.bin", "--parallel", "20", *ca)
    assert (big["status"], big["version"], big["bytes"], big["ok"]) == (200, 20, 2 << 20, 20)
    assert fetch(build_dir, f"https://localhost:{tls_port}/nope", *ca)["status"] == 404
    # Plain HTTP/1.1 to the same server, pooled keep-alive connections.
    plain = fetch(build_dir, f"http://127.0.0.1:{plain_port}/big.bin", "--parallel", "5")
    assert (plain["version"], plain["bytes"], plain["ok"]) == (11, 2 << 20, 5)


def test_client_speaks_h2c_to_h2o(h2o, build_dir):
    _, plain_port = h2o
    r = fetch(build_dir, f"http://127.0.0.1:{plain_port}/small.txt", "--h2c", "--parallel", "10")
    assert (r["status"], r["version"], r["ok"]) == (200, 20, 10)


def test_client_refuses_a_server_it_cannot_verify(nginx, build_dir):
    tls_port, _ = nginx
    out = subprocess.run([os.path.join(build_dir, "bin", "fetch"),
                          f"https://localhost:{tls_port}/small.txt"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "certificate verify failed" in out.stderr
