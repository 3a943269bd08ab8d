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

from conftest import Server

LOAD = [  # h2load arguments after the URL's scheme is chosen; (tls, arguments)
    (False, ["-n", "2000", "-c", "200", "--h1"]),
    (False, ["-n", "2000", "-c", "50", "-m", "10"]),
    (True, ["-n", "1000", "-c", "50", "-m", "10"]),
    (True, ["-n", "1000", "-c", "50", "--h1"]),
]


def test_serving_under_valgrind_has_no_error_and_frees_everything(build_dir, certs, tmp_path):
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if os.path.exists(cache) and re.search(r"CMAKE_BUILD_TYPE:\w+=(Asan|Tsan)", open(cache).read()):
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
    server = Server(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
                     "--errors-for-leak-kinds=all", f"--log-file={log}",
                     os.path.join(build_dir, "bin", "spindle"), "serve", "--config", str(config),
                     "--threads", "2"])
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
    report = log.read_text()
    assert code == 0, report[-3000:]
    assert "ERROR SUMMARY: 0 errors from 0 contexts" in report, report[-3000:]
    assert "in use at exit: 0 bytes in 0 blocks" in report, report[-3000:]
