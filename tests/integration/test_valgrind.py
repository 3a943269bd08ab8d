"""spindle serve under valgrind's memcheck: HTTP/1.1, h2c, HTTPS and HTTP/2 over TLS load from
h2load (a few hundred connections, a few thousand requests), then SIGTERM: 0 errors and 0 bytes
in use at exit. Fiber stacks are registered with valgrind (src/fiber/stack_pool.cc); without
that every stack switch is reported."""
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import Server, sanitizer_build

# spindle under memcheck, a core's worth each: the machine to itself (make test only).
pytestmark = pytest.mark.exclusive

LOAD = [  # h2load arguments after the URL's scheme is chosen; (tls, arguments)
    (False, ["-n", "2000", "-c", "200", "--h1"]),
    (False, ["-n", "2000", "-c", "50", "-m", "10"]),
    (True, ["-n", "1000", "-c", "50", "-m", "10"]),
    (True, ["-n", "1000", "-c", "50", "--h1"]),
]


def under_memcheck(build_dir, config, log):
    """spindle serve `config` (2 workers) under memcheck, its report going to `log`."""
    return Server(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
                   "--errors-for-leak-kinds=all", f"--log-file={log}",
                   os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(config),
                   "--threads", "2"])


def assert_clean(code, log):
    """spindle exited 0, and memcheck's report in `log` has no error and no byte in use."""
    report = log.read_text()
    assert code == 0, report[-3000:]
    assert "ERROR SUMMARY: 0 errors from 0 contexts" in report, report[-3000:]
    assert "in use at exit: 0 bytes in 0 blocks" in report, report[-3000:]


def test_serving_under_valgrind_has_no_error_and_frees_everything(build_dir, certs, tmp_path):
    if sanitizer_build(build_dir):
        pytest.skip("a sanitizer build cannot run under valgrind (the release build's run is "
                    "the valgrind check)")
    for tool in ("valgrind", "h2load"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install valgrind nghttp2-client): "
                        "the valgrind check did not run")
    config = tmp_path / "valgrind.yaml"
    config.write_text(f"""
servers:
  - listen: 127.0.0.1:0
    http2: true
  - listen: 127.0.0.1:0
    http2: true
    tls: {{cert: {certs}/localhost.pem, key: {certs}/localhost.key}}
""")
    log = tmp_path / "valgrind.log"
    server = under_memcheck(build_dir, config, log)
    try:
        # The second listening line (the TLS server) comes through the output reader.
        deadline = time.monotonic() + 60
        while not server.output and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.output, "the TLS server's listening line never came"
        tls_port = int(re.search(r'"address":"127\.0\.0\.1:(\d+)"', server.output[0]).group(1))
        for tls, args in LOAD:
            url = (f"https://127.0.0.1:{tls_port}/plaintext" if tls
                   else f"http://127.0.0.1:{server.port}/plaintext")
            out = subprocess.run(["h2load", *args, url], capture_output=True, text=True,
                                 timeout=300)
            n = int(args[1])
            assert f"{n} succeeded, 0 failed, 0 errored" in out.stdout, (url, args, out.stdout)
    finally:
        code = server.stop(timeout=120)
    assert_clean(code, log)


def test_proxying_under_valgrind_has_no_error_and_frees_everything(build_dir, tmp_path):
    """The gateway's path under memcheck, at a lower load: a route with a header edit, a rate
    limit shared through Redis (a redis-server of the test's own) and a local one, compression
    and a mirror, to an upstream over HTTP/1.1 and over h2c; HTTP/1.1 and h2c clients; then
    SIGTERM."""
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from proxy_support import upstream
    from test_rate_limit_redis import Redis
    if sanitizer_build(build_dir):
        pytest.skip("a sanitizer build cannot run under valgrind (the release build's run is "
                    "the valgrind check)")
    for tool in ("valgrind", "h2load", "redis-server"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (scripts/install-deps.sh test installs it)")
    redis = Redis(tmp_path)
    up = upstream(build_dir, "a")
    config = tmp_path / "proxy.yaml"
    config.write_text(f"""
redis: {{address: 127.0.0.1:{redis.port}, timeout: 500ms}}
servers:
  - listen: 127.0.0.1:0
    http2: true
routes:
  - name: h2
    match: {{path_prefix: /, headers: {{x-upstream: h2c}}}}
    service: b
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - headers: {{request: {{set: {{x-env: test}}}}, response: {{remove: [x-middleware]}}}}
      - rate_limit: {{key: route, rate: 1000000/s, burst: 1000000, store: redis, batch: 50}}
      - rate_limit: {{key: client_ip, rate: 1000000/s, burst: 1000000}}
      - compression: {{}}
      - mirror: {{service: a, max_in_flight: 4}}
    service: a
services:
  a: {{url: "http://{up.host}:{up.port}"}}
  b: {{url: "http://{up.host}:{up.port}", protocol: h2c}}
""")
    log = tmp_path / "valgrind.log"
    server = under_memcheck(build_dir, config, log)
    try:
        base = f"http://127.0.0.1:{server.port}"
        for args in (["-n", "600", "-c", "20", "--h1", f"{base}/plaintext"],
                     ["-n", "600", "-c", "10", "-m", "5", f"{base}/plaintext"],
                     # Through the HTTP/2 upstream client (h2c to the same upstream).
                     ["-n", "600", "-c", "10", "-m", "5", "-H", "x-upstream: h2c",
                      f"{base}/plaintext"],
                     ["-n", "20", "-c", "4", "--h1", "-H", "Accept-Encoding: gzip", f"{base}/big"]):
            out = subprocess.run(["h2load", *args], capture_output=True, text=True, timeout=300)
            n = int(args[1])
            assert f"{n} succeeded, 0 failed, 0 errored" in out.stdout, (args, out.stdout)
            assert "status codes: " in out.stdout and f"{n} 2xx" in out.stdout, out.stdout
        assert redis.evals() > 0  # the shared limit did ask Redis
    finally:
        code = server.stop(timeout=120)
        up.stop()
        redis.stop()
    assert_clean(code, log)
