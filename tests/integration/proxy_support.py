"""What the gateway tests share: upstreams and gateways started from a configuration text,
and small HTTP helpers."""
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time

import h2.config
import h2.connection
import h2.events

from conftest import Server
from ports import free_port  # noqa: F401  (one picker for the tests and the benchmarks)


def upstream(build_dir, name, keepalive_ms=None, tls=None, max_body=64 << 20, delay_ms=None,
             env=None):
    env = {"UPSTREAM_NAME": name, **(env or {})}
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
    """HOST:PORT of a started server (a scripted upstream listens on 127.0.0.1)."""
    return f"{getattr(server, 'host', '127.0.0.1')}:{server.port}"


def all_to(target, route="all", service="a", settings=""):
    """Routes and services that send every request (by route `route`) to service `service`:
    `target`, a server, with the service's further `settings` (YAML, e.g. "protocol: h2c")."""
    more = f", {settings}" if settings else ""
    return f"""
routes:
  - {{name: {route}, match: {{path_prefix: /}}, service: {service}}}
services:
  {service}: {{url: "http://{addr(target)}"{more}}}
"""


def services_to(**targets):
    """A services section: each keyword a service, to its server over plain HTTP."""
    return "services:\n" + "".join(f'  {name}: {{url: "http://{addr(target)}"}}\n'
                                    for name, target in targets.items())


def all_to_pool(targets, settings="", upstream=""):
    """Routes, services and upstreams that send every request to service pool (with its further
    `settings`), the upstream pool of `targets`: servers, "HOST:PORT" or (server, weight); the
    upstream's further keys are the YAML lines `upstream` (four spaces in)."""
    def entry(target):
        target, weight = target if isinstance(target, tuple) else (target, None)
        address = target if isinstance(target, str) else addr(target)
        return f'{{address: "{address}"' + (f", weight: {weight}}}" if weight else "}")

    more = f", {settings}" if settings else ""
    return f"""
routes:
  - {{name: all, match: {{path_prefix: /}}, service: pool}}
services:
  pool: {{upstream: pool{more}}}
upstreams:
  pool:
    targets: [{", ".join(entry(t) for t in targets)}]
{upstream}"""


def logging_server(log):
    """SERVER with its access log in JSON lines to the file `log`."""
    return SERVER.replace("access_log: off", f"access_log: {{path: {log}, format: json}}")


def access_records(log):
    """The JSON access log `log`'s records by request id."""
    return {r["request_id"]: r for r in map(json.loads, log.read_text().splitlines())}


class Process:
    """A started process whose output is thrown away; stop() terminates it."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(timeout=10)


class Stage:
    """What one test starts, stopped (last first) at its end whatever happened: gateways from a
    configuration text, test upstreams, and anything else with a stop(). The `stage` fixture."""

    def __init__(self, build_dir, tmp_path):
        self.build_dir = build_dir
        self.tmp_path = tmp_path
        self.started = []

    def keep(self, server):
        """`server`, to be stopped at the test's end."""
        self.started.append(server)
        return server

    def gateway(self, text, threads=2):
        """spindle serving the configuration `text` (proxy_support.gateway)."""
        return self.keep(gateway(self.build_dir, self.tmp_path, text, threads))

    def upstream(self, name, **settings):
        """A test upstream named `name` (proxy_support.upstream)."""
        return self.keep(upstream(self.build_dir, name, **settings))

    def process(self, argv):
        """A process started from `argv` whose output is thrown away (nginx, a tool): terminated
        at the test's end."""
        return self.keep(Process(argv))

    def stop(self):
        while self.started:
            self.started.pop().stop()


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


def read_request_head(conn, data=b""):
    """Reads from socket `conn` until `data` holds a whole request head: (the head, the bytes
    after it), or None if the peer closed first."""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return None
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def held_dead_port():
    """(socket, port): a port bound and never listened on, for an upstream that is down. A
    connection to it is refused for as long as the socket lives; a port only found free (as
    free_port's) can be handed to the next bind to port 0 meanwhile, the gateway's own listener
    included, which makes the "dead" upstream the gateway itself (a loop, answered 503)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


SERVER = """
servers:
  - name: public
    listen: 127.0.0.1:0
    http2: true
    access_log: off
    limits: {max_body: 4g}
"""


def one_route(upstream, extra_server="", routes=None):
    """A gateway configuration (HTTP/2 on, no access log) whose `routes` (by default one for
    every path) send to service s, the scripted `upstream`."""
    routes = routes or "  - {name: all, match: {path_prefix: /}, service: s}\n"
    return f"""
servers:
  - listen: 127.0.0.1:0
    http2: true
    access_log: off
{extra_server}
routes:
{routes}
services:
  s: {{url: "http://127.0.0.1:{upstream.port}"}}
"""


def pool_config(targets, routes, servers_extra="", services_extra="", upstream_extra=""):
    """A gateway configuration behind a trusted proxy on 127.0.0.1 whose `routes` send to
    service s, the upstream u of the scripted `targets`."""
    target_list = ", ".join(f"{{address: '127.0.0.1:{t.port}'}}" for t in targets)
    return f"""
servers:
  - listen: 127.0.0.1:0
    access_log: off
    trusted_proxies: [127.0.0.1]
{servers_extra}
routes:
{routes}
services:
  s: {{upstream: u{services_extra}}}
upstreams:
  u:
    targets: [{target_list}]
{upstream_extra}
"""


# The one route of pool_config's tests: every path to service s.
POOL_ROUTE = "  - {name: all, match: {path_prefix: /}, service: s}\n"


class ScriptedUpstream:
    """A loopback upstream written in the test: accepts connections (counting them) and hands
    each to `self.handle(conn)` on a thread of its own."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn):
        raise NotImplementedError

    def stop(self):
        self.running = False
        self.sock.close()


def wait_until(check, seconds=5):
    """Calls `check` until it returns something true (returned), or `seconds` pass (None)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    return None


def config_error(build_dir, path):
    """check-config on the file at `path`: its error output, once it has exited 1."""
    done = subprocess.run([os.path.join(build_dir, "bin", "spindle"), "check-config", str(path)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done.stdout
    return done.stderr


def middleware_config_error(build_dir, tmp_path, middlewares):
    """check-config on a one-route configuration whose `middlewares` is the YAML value given
    (on line 5): its error output, once it has exited 1."""
    config = tmp_path / "bad.yaml"
    config.write_text(f"""servers:
  - {{listen: 127.0.0.1:0}}
routes:
  - match: {{path_prefix: /}}
    middlewares: {middlewares}
    service: s
services:
  s: {{url: "http://127.0.0.1:9"}}
""")
    return config_error(build_dir, config)


def read_request(conn, data=b""):
    """Reads one whole request (head, and a body by Content-Length or chunked) from socket
    `conn`: (head bytes, body bytes, the bytes after it), or None if the peer closed first."""
    got = read_request_head(conn, data)
    if got is None:
        return None
    head, rest = got
    lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields.setdefault(name.strip().lower(), value.strip())

    def more():
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a body")
        return chunk

    body = b""
    try:
        if "chunked" in fields.get("transfer-encoding", "").lower():
            while True:
                while b"\r\n" not in rest:
                    rest += more()
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    while not (rest.startswith(b"\r\n") or b"\r\n\r\n" in rest):
                        rest += more()
                    rest = rest[2:] if rest.startswith(b"\r\n") else rest.partition(b"\r\n\r\n")[2]
                    break
                while len(rest) < size + 2:
                    rest += more()
                body += rest[:size]
                rest = rest[size + 2:]
        else:
            length = int(fields.get("content-length", "0"))
            while len(rest) < length:
                rest += more()
            body, rest = rest[:length], rest[length:]
    except ConnectionError:
        return None
    return head, body, rest


class RecordingUpstream(ScriptedUpstream):
    """An HTTP/1.1 upstream that records every request it receives (its head as bytes, and its
    body) and answers each with `self.answer(head, body)`: bytes, or a list of byte strings
    written with `self.pause` seconds between them. Keeps connections alive."""

    def __init__(self, pause=0.05):
        self.requests = []
        self.pause = pause
        self.lock = threading.Lock()
        super().__init__()

    def answer(self, head, body):
        text = f"{len(self.requests)}".encode()
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text)

    def targets(self):
        """The request lines received, in order."""
        with self.lock:
            return [h.split(b"\r\n", 1)[0].decode("latin-1") for h, _ in self.requests]

    def handle(self, conn):
        data = b""
        try:
            while True:
                got = read_request(conn, data)
                if got is None:
                    return
                head, body, data = got
                with self.lock:
                    self.requests.append((head, body))
                reply = self.answer(head, body)
                for i, piece in enumerate(reply if isinstance(reply, list) else [reply]):
                    if i:
                        time.sleep(self.pause)
                    conn.sendall(piece)
        except OSError:
            pass
        finally:
            conn.close()


def raw(server, data, wait=5.0):
    """Sends `data` on a new connection and reads until the server closes or `wait` passes."""
    with socket.create_connection((server.host, server.port), timeout=wait) as s:
        s.sendall(data)
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except socket.timeout:
            pass
        return got


def h2_connect(server):
    """A new HTTP/2 client connection to `server`, its preface sent: (socket, h2 connection)."""
    s = socket.create_connection((server.host, server.port), timeout=10)
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    return s, conn


def h2_events_until(s, conn, done, seconds=10):
    """Reads and returns events until `done(events)` or the connection closes."""
    events = []
    deadline = time.monotonic() + seconds
    s.settimeout(min(0.5, seconds))
    while time.monotonic() < deadline and not done(events):
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not data:
            break
        events += conn.receive_data(data)
        out = conn.data_to_send()
        if out:
            try:
                s.sendall(out)
            except OSError:
                break
    return events


def request_headers(path, method="GET", authority="a"):
    """The pseudo-header fields of an http request for `path`."""
    return [(":method", method), (":path", path), (":scheme", "http"),
            (":authority", authority)]


def h2_post(server, path, body, length=True, timeout=15):
    """POSTs `body` on a new HTTP/2 connection, as the gateway's windows allow, with a
    content-length (or none: `length` False), until its answer ends or its stream is reset:
    (status, body); (None, None) if the stream was reset before its answer ended. Fails if the
    gateway ends the connection."""
    s, conn = h2_connect(server)
    s.settimeout(timeout)
    framing = [("content-length", str(len(body)))] if length else []
    conn.send_headers(1, request_headers(path, "POST") + framing, end_stream=not body)
    status, got, sent, over = None, b"", 0, False
    try:
        while not over:
            room = min(conn.local_flow_control_window(1), len(body) - sent)
            while room > 0:
                n = min(room, conn.max_outbound_frame_size)
                conn.send_data(1, body[sent:sent + n], end_stream=sent + n == len(body))
                sent, room = sent + n, room - n
            s.sendall(conn.data_to_send())
            data = s.recv(65536)
            assert data, "the gateway closed the connection"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    got += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    over = True
                elif isinstance(event, h2.events.StreamReset) and not over:
                    return None, None
                elif isinstance(event, h2.events.ConnectionTerminated):
                    raise AssertionError(f"the gateway ended the connection: {event}")
            s.sendall(conn.data_to_send())
    finally:
        s.close()
    return status, got


class Auth(ScriptedUpstream):
    """Answers each GET with `self.reply` (bytes, or a callable of the request count); counts
    the requests it read."""

    def __init__(self, reply, close=False):
        self.reply = reply
        self.close = close
        self.asked = 0
        super().__init__()

    def handle(self, conn):
        with conn:
            data = b""
            try:
                while True:
                    got = read_request_head(conn, data)
                    if got is None:
                        return
                    data = got[1]
                    self.asked += 1
                    reply = self.reply(self.asked) if callable(self.reply) else self.reply
                    if reply is None:
                        conn.recv(1)  # stalls: never answers
                        return
                    conn.sendall(reply)
                    if self.close:
                        return
            except OSError:
                pass


def auth_config(target, auth, first_byte="2s"):
    return SERVER + f"""
routes:
  - name: free
    match: {{path_prefix: /free}}
    middlewares: [{{strip_prefix: /free}}]
    service: a
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - forward_auth: {{service: auth, path: /verify, response_headers: [X-Auth-User]}}
    service: a
services:
  a: {{url: "http://{addr(target)}"}}
  auth: {{url: "http://127.0.0.1:{auth.port}", timeouts: {{connect: 1s, first_byte: {first_byte}}}}}
"""


class HostileShadow(ScriptedUpstream):
    """A mirror target that misbehaves as `kind` says, counting its connections open."""

    def __init__(self, kind):
        self.kind = kind
        self.open = 0
        super().__init__()

    def handle(self, conn):
        self.open += 1
        try:
            if self.kind == "stalls":  # reads nothing, answers nothing
                conn.settimeout(10)
                conn.recv(1, socket.MSG_PEEK)
                time.sleep(10)
            elif self.kind == "resets":
                read_request_head(conn)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            elif self.kind == "switches":
                read_request_head(conn)
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n"
                             b"Connection: upgrade\r\n\r\n" + b"\xff" * 65536)
                conn.recv(1)
            elif self.kind == "floods":
                read_request_head(conn)
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                while True:
                    conn.sendall(b"4000\r\n" + b"z" * 0x4000 + b"\r\n")
            elif self.kind == "holds":  # reads its requests, never answers, never closes
                while conn.recv(65536):
                    pass
        except OSError:
            pass
        finally:
            conn.close()
            self.open -= 1


def mirrored(target, shadow_address, settings="", service_settings=""):
    return SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - mirror: {{service: shadow, timeout: 1s{settings}}}
    service: a
services:
  a: {{url: "http://{addr(target)}"{service_settings}}}
  shadow: {{url: "http://{shadow_address}"}}
"""


def response_status(s):
    data = b""
    while b"\r\n" not in data:
        more = s.recv(4096)
        if not more:
            break
        data += more
    return int(data.split()[1]) if data else None


def spindle_bin(build_dir):
    return os.path.join(build_dir, "bin", "spindle")


def serve_file(build_dir, path, threads=1):
    checked = subprocess.run([spindle_bin(build_dir), "check-config", str(path)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    return Server([spindle_bin(build_dir), "serve", "--config", str(path), "--threads",
                   str(threads)])


def config_in_force(admin_port):
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
    try:
        conn.request("GET", "/config")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def reload_and_wait(gw, path, text, admin_port, marker):
    """Writes `text` (atomically) and sends SIGHUP; waits until the admin listener's /config
    holds `marker` (the reload's own lines may be suppressed in a storm of them)."""
    staged = path.with_name("staged.yaml")
    staged.write_text(text)
    os.rename(staged, path)
    gw.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: marker in config_in_force(admin_port), 10), gw.errors[-5:]


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def metric(admin_port, name, **labels):
    """The value of metric `name` with exactly `labels` on the admin listener's /metrics, or None."""
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} " if want else f"{name} "):
            return float(line.split()[-1])
    return None
