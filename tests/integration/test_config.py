"""The configuration file: every documented key is accepted and has its effect, every example
of the documentation loads, and every malformed file, whatever its shape, is an error naming
the file, the line and the key, with exit code 1 (never a crash)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import ROOT, Server, memory_kib
from proxy_support import config_error, free_port, request, wait_until


sys.path.insert(0, os.path.join(ROOT, "scripts"))
import config_examples  # noqa: E402

DOC = os.path.join(ROOT, "docs", "configuration.md")

# A value for every documented key (its path as in the documentation's headings). A key the
# documentation lists without a value here fails the test below: add one.
SAMPLES = {
    "threads": "2",
    "huge_page_stacks": "true",
    "drain_timeout": "3s",
    "admin": "{listen: 127.0.0.1:0}",
    "redis": None,  # a section: its keys one by one
    "dns": None,
    "dns.servers": "['127.0.0.1:53', '[::1]:5353']",
    "dns.min_ttl": "2s",
    "dns.max_ttl": "1m",
    "dns.srv_refresh": "30s",
    "dns.timeout": "1s",
    "dns.stale_grace": "10m",
    "upstreams.NAME.srv": "_http._tcp.api.example",
    "redis.address": "localhost:6379",
    "redis.timeout": "20ms",
    "redis.password": "s3cret",
    "redis.database": "2",
    "redis.backoff": "500ms",
    "servers": None,  # the list itself
    "servers[].listen": "127.0.0.1:0",
    "servers[].default_site": "true",
    "servers[].root": "{tmp}",
    "servers[].server_name": "example",
    "servers[].compression": "false",
    "servers[].limits": None,
    "servers[].http2_limits": None,
    "servers[].http2_limits.max_concurrent_streams": "50",
    "servers[].http2_limits.stream_window": "128k",
    "servers[].http2_limits.connection_window": "8m",
    "servers[].http2_limits.max_header_frames": "16",
    "servers[].http2_limits.reset_budget": "500",
    "servers[].http2_limits.running_reset_burst": "50",
    "servers[].http2_limits.running_resets_per_second": "10",
    "servers[].http2_limits.empty_frame_budget": "100",
    "servers[].http2_limits.settings_budget": "20",
    "servers[].http2_limits.max_unread_output": "2m",
    "servers[].paths": None,
    "servers[].paths.escaped_slashes": "keep",
    "servers[].paths.merge_slashes": "false",
    "servers[].timeouts": None,
    "servers[].access_log": "off",
    "servers[].tls": None,
    "servers[].http2": "true",
    "servers[].limits.max_request_line": "4k",
    "servers[].limits.max_header_size": "8k",
    "servers[].limits.max_headers": "50",
    "servers[].limits.max_body": "2m",
    "servers[].limits.max_requests_per_connection": "100",
    "servers[].limits.max_connections_per_worker": "1000",
    "servers[].timeouts.header": "5s",
    "servers[].timeouts.body": "20s",
    "servers[].timeouts.keepalive": "30s",
    "servers[].timeouts.write": "15s",
    "servers[].timeouts.handshake": "3s",
    "servers[].access_log.path": "{tmp}/access.log",
    "servers[].access_log.format": "json",
    "servers[].access_log.buffer": "8m",
    "servers[].name": "edge",
    "servers[].trusted_proxies": "[10.0.0.0/8, '::1']",
    "routes": None,
    "services": None,
    "upstreams": None,
    "routes[].name": "api",
    "routes[].servers": "[public]",
    "routes[].match": "{path: /x}",
    "routes[].service": "s",
    "routes[].upgrades": "[websocket, foo]",
    "routes[].match.hosts": "[api.example.com, '*.example.com']",
    "routes[].match.path": "/exact",
    "routes[].match.path_prefix": "/api/",
    "routes[].match.path_regex": "'^/v[0-9]+/'",
    "routes[].match.methods": "[GET, POST]",
    "routes[].match.headers": "{x-canary: '1'}",
    "services.NAME.upstream": "u",
    "services.NAME.url": "https://127.0.0.1:8443",
    "services.NAME.protocol": "h2c",
    "services.NAME.timeouts": None,
    "services.NAME.retries": None,
    "services.NAME.timeouts.connect": "1s",
    "services.NAME.timeouts.first_byte": "15s",
    "services.NAME.timeouts.read": "30s",
    "services.NAME.timeouts.write": "30s",
    "services.NAME.timeouts.idle": "60s",
    "services.NAME.timeouts.tunnel": "1h",
    "services.NAME.retries.attempts": "3",
    "services.NAME.retries.budget": "10%",
    "upstreams.NAME.limits": None,
    "upstreams.NAME.limits.max_connections": "100",
    "upstreams.NAME.limits.max_pending": "10",
    "upstreams.NAME.limits.preempt_stalled": "5s",
    "routes[].middlewares": "[{strip_prefix: /api}]",
    "routes[].middlewares.headers": "{request: {set: {x-env: prod}}, response: {remove: [server]}}",
    "routes[].middlewares.strip_prefix": "/api",
    "routes[].middlewares.add_prefix": "/v1",
    "routes[].middlewares.rate_limit":
        "{key: client_ip, rate: 100/s, burst: 100, store: redis, failure_mode: closed, batch: 5}",
    "routes[].middlewares.replace_path": "/v2/users",
    "routes[].middlewares.replace_path_regex": "{regex: '^/a/(.*)', replacement: '/b/\\1'}",
    "routes[].middlewares.ip_allow": "[10.0.0.0/8]",
    "routes[].middlewares.ip_deny": "[192.0.2.0/24]",
    "routes[].middlewares.max_body": "1m",
    "routes[].middlewares.redirect": "{scheme: https, status: 301}",
    "routes[].middlewares.respond": "{status: 204}",
    "routes[].middlewares.cors": "{origins: [https://app.example], credentials: true}",
    "routes[].middlewares.traffic_split": "{services: [{service: s, weight: 9}], sticky_cookie: v}",
    "routes[].middlewares.basic_auth": "{users_file: {tmp}/users.htpasswd, realm: Office}",
    "routes[].middlewares.forward_auth":
        "{service: s, path: /auth, request_headers: [Cookie], response_headers: [X-User]}",
    "routes[].middlewares.mirror": "{service: s, percent: 10, max_in_flight: 8, timeout: 2s}",
    "routes[].middlewares.compression": "{min_size: 512, gzip_level: 4, brotli_quality: 3}",
    "routes[].middlewares.jwt": ("{jwks_file: {tmp}/keys.json, algorithms: [HS256], issuer: me, "
                                 "audience: api, leeway: 5s, cookie: s, realm: R, "
                                 "claims_to_headers: {sub: x-user}}"),
    "services.NAME.tls": None,
    "services.NAME.tls.ca": "/etc/ssl/certs/ca-certificates.crt",
    "services.NAME.tls.verify": "false",
    "services.NAME.request_buffering": "1m",
    "services.NAME.tls.server_name": "api.internal",
    "upstreams.NAME.balancer": "{consistent_hash: {by: cookie, key: session}}",
    "upstreams.NAME.targets": "[{address: '[::1]:9', weight: 3}, {address: localhost:10}]",
    "upstreams.NAME.health": None,
    "upstreams.NAME.keepalive": None,
    "upstreams.NAME.health.active": "{path: /healthz, interval: 2s, timeout: 1s}",
    "upstreams.NAME.health.passive": "{max_fails: 0, max_ejection_percent: 50}",
    "upstreams.NAME.health.panic_threshold": "30",
    "upstreams.NAME.keepalive.max_idle": "8",
    "upstreams.NAME.keepalive.idle_timeout": "5s",
}


def documented_keys():
    """The key paths of the documentation's tables: '## `servers[].limits`' + '| `max_body` |'."""
    keys = []
    section = None
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            heading = re.match(r"^## (?:`([^`]+)`|Top level)\s*$", line)
            if heading:
                section = heading.group(1) or ""
                continue
            if line.startswith("## ") or line.startswith("### "):
                section = None  # library option structs and prose sections: not file keys
                continue
            row = re.match(r"^\| `([a-z_0-9]+)` \|", line)
            if row and section is not None:
                keys.append(f"{section}.{row.group(1)}" if section else row.group(1))
    return keys


def yaml_for(path, value):
    """A whole configuration that sets `path` to `value` (YAML text) and has whatever else must
    be there: a named server, a route, a service `s` and an upstream `u` to hang keys on."""
    config = {
        "servers": [{"name": "public", "listen": "127.0.0.1:0"}],
        "routes": [{"name": "r", "match": {}, "service": "s"}],
        "services": {"s": {"url": "http://127.0.0.1:9"}},
        "upstreams": {"u": {"targets": [{"address": "127.0.0.1:9"}]}},
        "redis": {"address": "127.0.0.1:6379"},
    }
    parts = path.replace("[]", "").replace(".NAME", "").split(".")
    node = {"servers": config["servers"][0], "routes": config["routes"][0],
            "services": config["services"]["s"], "upstreams": config["upstreams"]["u"],
            "redis": config["redis"], "dns": config.setdefault("dns", {})}
    parsed = yaml.safe_load(value)
    if len(parts) == 1:
        config[parts[0]] = parsed
    else:
        target = node[parts[0]]
        for part in parts[1:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = parsed
    if path == "upstreams.NAME.srv":
        del config["upstreams"]["u"]["targets"]  # one of the two
    if path == "services.NAME.upstream":
        del config["services"]["s"]["url"]  # one of the two
    if path.startswith("routes[].middlewares."):
        config["routes"][0]["middlewares"] = [{parts[-1]: parsed}]  # a list of one
        return yaml.safe_dump(config)
    if path.startswith("services.NAME.tls"):
        config["services"]["s"]["url"] = "https://127.0.0.1:9"  # TLS is for https://
    return yaml.safe_dump(config)


def check_config(build_dir, path):
    return subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config", str(path)],
                          capture_output=True, text=True, timeout=30)


def test_every_documented_key_is_accepted(build_dir, tmp_path):
    keys = documented_keys()
    assert "servers[].limits.max_connections_per_worker" in keys and len(keys) >= 20, keys
    missing = [k for k in keys if k not in SAMPLES]
    assert not missing, f"documented keys without a sample value in this test: {missing}"
    # What the samples name: an htpasswd file.
    (tmp_path / "users.htpasswd").write_text("bob:{SHA}fEqNCco3Yq9h5ZUglD3CZJT4lBs=\n")
    (tmp_path / "keys.json").write_text('{"keys": [{"kty": "oct", "k": "' + "A" * 43 + '"}]}')
    for key in keys:
        value = SAMPLES[key]
        if value is None:
            continue  # a section: its keys are checked one by one
        config = tmp_path / "key.yaml"
        config.write_text(yaml_for(key, value.replace("{tmp}", str(tmp_path))))
        out = check_config(build_dir, config)
        assert out.returncode == 0, f"{key}: {out.stderr}\n{config.read_text()}"


def test_every_example_of_the_documentation_loads(build_dir, tmp_path, certs):
    docs = sorted(os.path.join(ROOT, "docs", d) for d in os.listdir(os.path.join(ROOT, "docs"))
                  if d.endswith(".md"))
    count = 0
    for doc in docs:
        for i, text in enumerate(config_examples.examples(doc)):
            # The files an example names are made here: test certificates for PEM files, an
            # empty folder for a root.
            for name in set(re.findall(r"([\w.-]+\.(?:pem|key))", text)):
                src = "localhost.key" if name.endswith(".key") else "localhost.pem"
                shutil.copy(os.path.join(certs, src), tmp_path / name)
            config = tmp_path / f"{os.path.basename(doc)}-{i}.yaml"
            config.write_text(text)
            out = check_config(build_dir, config)
            assert out.returncode == 0, f"{doc} example {i}: {out.stderr}\n{text}"
            count += 1
    assert count >= 2


GW = 'servers: [{name: public, listen: "127.0.0.1:1"}]\n'
SVC = "services:\n  s: {url: 'http://127.0.0.1:9'}\n"


@pytest.mark.parametrize("text, line, key", [
    ('servers: [{listen: "127.0.0.1:1", tls: {cert: C, key: K, names: [[a]]}}]', 1,
     "servers[0].tls.names[0]"),
    ("servers:\n  - listen: [1]\n", 2, "servers[0].listen"),
    ("servers:\n  - listen: 127.0.0.1:1\n    listen: 127.0.0.1:2\n", 3, "servers[0].listen"),
    ("- 1\n- 2\n", 1, "(top level)"),
    ("{[a]: 1}\n", 1, "(top level)"),
    ("servers: {a: 1}\n", 1, "servers"),
    ("servers:\n  - listen: 127.0.0.1:1\n    access_log: [a]\n", 3, "servers[0].access_log"),
    ("servers:\n  - listen: 127.0.0.1:1\n    limits: {max_headers: ~}\n", 3,
     "servers[0].limits.max_headers"),
    ("servers:\n  - listen: 127.0.0.1:1\n    tls: {cert: /dev/zero, key: /dev/zero}\n", 3,
     "servers[0].tls.cert"),
    ("threads: {a: b}\nservers: [{listen: 127.0.0.1:1}]\n", 1, "threads"),
    ("servers:\n  - listen: 127.0.0.1:1\n    timeouts: {header: 10 s}\n", 3,
     "servers[0].timeouts.header"),
    ("servers:\n  - listen: 127.0.0.1:1\n    http2_limits: {stream_window: 3g}\n", 3,
     "servers[0].http2_limits.stream_window"),
    ("servers:\n  - listen: 127.0.0.1:1\n    http2_limits: {max_concurrent_streams: 0}\n", 3,
     "servers[0].http2_limits.max_concurrent_streams"),
    ("servers:\n  - listen: 127.0.0.1:1\n    http2_limits: {resets: 1}\n", 3,
     "servers[0].http2_limits"),
    ("servers:\n  - listen: 127.0.0.1:1\n    server_name: \"a\\r\\nb\"\n", 3,
     "servers[0].server_name"),
    ("servers: [{listen: 127.0.0.1:1}]\n  bad: indentation\n", 2, "invalid YAML"),
    ("", 1, "servers"),
    ("threads: 1\n\"\": 2\n", 2, '""'),
    # The gateway: references, regular expressions, networks.
    (GW + "routes:\n  - match: {}\n    service: nope\n", 4, "routes[0].service: no service"),
    (GW + "services:\n  s: {upstream: nope}\n", 3, "services.s.upstream: no upstream"),
    (GW + "routes:\n  - match: {path_regex: '(a'}\n    service: s\n" + SVC, 3,
     "routes[0].match.path_regex: invalid regular expression"),
    ("servers:\n  - listen: 127.0.0.1:1\n    trusted_proxies: [10.0.0.1/8]\n", 3,
     "servers[0].trusted_proxies: '10.0.0.1/8'"),
    (GW + "routes:\n  - servers: [other]\n    match: {}\n    service: s\n" + SVC, 3,
     "routes[0].servers: no server named 'other'"),
    (GW + "upstreams:\n  u:\n    balancer: fastest\n    targets: [{address: '127.0.0.1:9'}]\n",
     4, "upstreams.u.balancer"),
    (GW + "upstreams:\n  u: {targets: [{address: '127.0.0.1'}]}\n", 3,
     "upstreams.u.targets[0].address"),
    (GW + "services:\n  s: {url: 'http://a:1', upstream: u}\n", 3, "services.s.upstream"),
    (GW + "services:\n  s:\n    url: 'http://a:1'\n    retries: {budget: 120%}\n", 5,
     "services.s.retries.budget"),
    (GW + "services:\n  s: {url: 'https://a:1', protocol: h2c}\n", 3, "services.s.protocol"),
    # (Before, the file loaded and every request failed its TLS handshake: 502.)
    (GW + "services:\n  s: {url: 'http://a:1', protocol: h2}\n", 3,
     "services.s.protocol: h2 is HTTP/2 over TLS"),
    (GW + "services:\n  s: {url: 'http://a:1', tls: {verify: false}}\n", 3, "services.s.tls"),
    (GW + "services:\n  s: {url: 'https://a:1', tls: {ca: /dev/null}}\n", 3, "services.s.tls.ca"),
])
def test_a_malformed_file_is_an_error_with_file_line_and_key(build_dir, tmp_path, certs, text,
                                                             line, key):
    config = tmp_path / "bad.yaml"
    config.write_text(text.replace("C,", f"{certs}/localhost.pem,")
                      .replace("K,", f"{certs}/localhost.key,"))
    for argv in (["check-config", str(config)], ["serve", "--config", str(config)]):
        out = subprocess.run([os.path.join(build_dir, "bin", "spindle"), *argv],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 1, (argv, out.returncode, out.stderr)
        assert out.stderr.startswith(f"spindle: {config}:{line}: {key}"), out.stderr
        assert "terminate called" not in out.stderr


def test_max_connections_per_worker_is_enforced(build_dir, tmp_path, http):
    config = tmp_path / "limit.yaml"
    config.write_text("servers:\n  - listen: 127.0.0.1:0\n    access_log: off\n"
                      "    limits: {max_connections_per_worker: 2}\n")
    server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                     str(config), "--threads", "1"])
    try:
        kept = [server.connect() for _ in range(2)]
        for c in kept:
            c.sendall(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n")
            assert http.read_response(c)[0] == 200
        third = server.connect()
        third.sendall(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n")
        assert http.read_response(third)[0] == 503
        kept[0].close()
        time.sleep(0.2)
        fourth = server.connect()
        fourth.sendall(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n")
        assert http.read_response(fourth)[0] == 200
    finally:
        server.stop()


def _transparent_huge_pages():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def test_huge_page_stacks_put_the_fibers_stacks_on_huge_pages(build_dir, tmp_path, http):
    if not _transparent_huge_pages():
        pytest.skip("transparent huge pages are off in this kernel ([never])")
    results = {}
    for flag in ("false", "true"):
        config = tmp_path / f"huge-{flag}.yaml"
        config.write_text(f"huge_page_stacks: {flag}\n"
                          "servers:\n  - listen: 127.0.0.1:0\n    access_log: off\n")
        server = Server([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                         str(config), "--threads", "1"])
        try:
            conns = [server.connect() for _ in range(20)]
            for c in conns:
                c.sendall(b"GET /plaintext HTTP/1.1\r\nHost: x\r\n\r\n")
            for c in conns:
                status, _, body = http.read_response(c)
                assert (status, body) == (200, b"Hello, World!")
            results[flag] = memory_kib(server.proc.pid, "AnonHugePages", "smaps_rollup")
        finally:
            assert server.stop() == 0
    # A chunk's first 2 MiB page at least; without the key no stack is on one.
    assert results["true"] >= 2048, results
    assert results["false"] < results["true"], results


def test_an_address_in_use_by_another_spindle_is_refused(build_dir, tmp_path, spindle):
    second = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "serve", "--listen",
                             f"127.0.0.1:{spindle.port}", "--threads", "2"],
                            capture_output=True, text=True, timeout=30)
    assert second.returncode == 1, second.stdout
    assert f"cannot listen on 127.0.0.1:{spindle.port}: Address already in use" in second.stderr
    # The admin listener on a server's address: a configuration error, with its line.
    port = free_port()
    config = tmp_path / "admin.yaml"
    config.write_text(f"admin: {{listen: 127.0.0.1:{port}}}\nservers:\n"
                      f"  - listen: 127.0.0.1:{port}\n")
    error = config_error(build_dir, config)
    assert re.search(r"admin.yaml:3: servers\[0\]\.listen: the admin listener is there already",
                     error), error


def test_check_config_refuses_a_root_serve_could_not_use(build_dir, tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for root, why in ((tmp_path / "missing", "No such file or directory"),
                      (a_file, "is not a directory")):
        config = tmp_path / "site.yaml"
        config.write_text(f"servers:\n  - listen: 127.0.0.1:0\n    root: {root}\n")
        error = config_error(build_dir, config)
        assert re.search(rf"site.yaml:3: servers\[0\]\.root: .*{why}", error), error
        served = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "serve", "--config",
                                 str(config)], capture_output=True, text=True, timeout=30)
        assert served.returncode == 1 and error.strip() in served.stderr, served.stderr


# ---- files a middleware names, swapped for what is no regular file ---------------------------


USERS = "alice:{SHA}qUqP5cyxm6YcTAhz05Hph5gvu9M=\n"


JWKS = '{"keys": [{"kty": "oct", "k": "' + "A" * 43 + '"}]}'


def file_config(tmp_path, kind):
    middleware = ("{basic_auth: {users_file: named}}" if kind == "users_file"
                  else "{jwt: {jwks_file: named}}")
    return f"""servers:
  - {{listen: 127.0.0.1:0, access_log: off}}
routes:
  - name: open
    match: {{path: /open}}
    middlewares: [{{respond: {{body: open}}}}]
    service: s
  - match: {{path_prefix: /}}
    middlewares: [{middleware}]
    service: s
services:
  s: {{url: "http://127.0.0.1:9"}}
"""


@pytest.mark.parametrize("kind", ["users_file", "jwks_file"])
def test_a_named_file_that_is_a_fifo_is_refused_at_once(build_dir, tmp_path, kind):
    import subprocess
    os.mkfifo(tmp_path / "named")
    config = tmp_path / "gateway.yaml"
    config.write_text(file_config(tmp_path, kind))
    done = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config",
                           str(config)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 1 and "not a regular file" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["users_file", "jwks_file"])
def test_a_reload_meeting_a_fifo_for_a_named_file_keeps_serving_and_stops_on_sigterm(
        build_dir, tmp_path, kind):
    from test_reload import Gateway
    named = tmp_path / "named"
    named.write_text(USERS if kind == "users_file" else JWKS)
    gw = Gateway(build_dir, tmp_path, file_config(tmp_path, kind), threads=1)
    try:
        assert request(gw.server, "GET", "/open")[2] == b"open"
        named.unlink()
        os.mkfifo(named)  # a deploy left a pipe where the file was
        before = len(gw.server.errors)
        gw.server.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: any("rejected" in line and "not a regular file" in line
                                      for line in gw.server.errors[before:]), seconds=5), \
            gw.server.errors[before:]
        assert request(gw.server, "GET", "/open")[2] == b"open"
        gw.server.proc.send_signal(signal.SIGTERM)
        assert gw.server.proc.wait(timeout=5) == 0
    finally:
        gw.stop(signal.SIGKILL)
