"""Toxiproxy (Shopify's fault-injection TCP proxy) for the fault tests.

A test puts a proxy between a client and a real server, then changes what the network does
while traffic flows: latency, a stall, a reset in the middle of a response, a bandwidth limit,
a listener that refuses connections. The server is built from a pinned Go module
(scripts/install-toxiproxy.sh, into build/tools/), started on a free loopback port and stopped
by its PID.

    from toxiproxy import toxiproxy  # the fixture (a Toxiproxy for the test)

    def test_x(toxiproxy):
        db = toxiproxy.proxy("pg", "127.0.0.1:5432")          # listens on 127.0.0.1:db.port
        stall = db.add("timeout", timeout=0)                   # bytes swallowed both ways
        db.remove(stall)                                       # (which closes those connections)
        db.disable()                                           # connections refused
        db.enable()                                            # the same port again

Toxic types and their attributes: https://github.com/Shopify/toxiproxy#toxics (latency,
bandwidth, slow_close, timeout, reset_peer, slicer, limit_data). Outside pytest, use
Toxiproxy() and stop() directly; Unavailable says why it could not start.
"""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from ports import free_port  # noqa: E402  (one picker for the tests and the benchmarks)

SERVER = os.path.join(ROOT, "build", "tools", "toxiproxy-server")
INSTALL = os.path.join(ROOT, "scripts", "install-toxiproxy.sh")
NO_GO = 3  # install-toxiproxy.sh's exit status when Go is not installed


class Unavailable(Exception):
    """Toxiproxy cannot exist on this machine (no Go toolchain to build it)."""


def build():
    """Builds the server if it is missing. Raises Unavailable without Go, RuntimeError if the
    build failed."""
    if os.access(SERVER, os.X_OK):
        return SERVER
    done = subprocess.run([INSTALL], capture_output=True, text=True)
    if done.returncode == NO_GO:
        raise Unavailable(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"scripts/install-toxiproxy.sh failed: {done.stderr.strip()}")
    return SERVER


class Proxy:
    """One proxy: listens on 127.0.0.1:port, forwards to its upstream."""

    def __init__(self, api, name, port):
        self.api, self.name, self.port = api, name, port
        self.host = "127.0.0.1"

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def add(self, kind, stream="downstream", toxicity=1.0, name=None, **attributes):
        """Adds a toxic of type `kind` ("latency", "timeout", ...) on `stream` ("downstream":
        server to client, "upstream": client to server); returns its name (for remove())."""
        name = name or f"{kind}_{stream}_{time.monotonic_ns()}"
        self.api.call("POST", f"/proxies/{self.name}/toxics",
                      {"name": name, "type": kind, "stream": stream, "toxicity": toxicity,
                       "attributes": attributes})
        return name

    def remove(self, toxic):
        self.api.call("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def toxics(self):
        """The names of the toxics in force."""
        return [t["name"] for t in self.api.call("GET", f"/proxies/{self.name}/toxics")]

    def disable(self):
        """Closes the listener and every connection through it: new connections are refused."""
        self.api.call("PATCH", f"/proxies/{self.name}", {"enabled": False})

    def enable(self):
        """Listens again, on the same port."""
        self.api.call("PATCH", f"/proxies/{self.name}", {"enabled": True})

    def delete(self):
        """Closes the listener and every connection through it, for good."""
        self.api.call("DELETE", f"/proxies/{self.name}")


class Toxiproxy:
    """A Toxiproxy server of the caller's own (started now, stopped by stop())."""

    def __init__(self, timeout=10.0):
        binary = build()
        self.port = free_port()
        self.proc = subprocess.Popen([binary, "-host", "127.0.0.1", "-port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        give_up = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", "/version")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > give_up:
                    self.stop()
                    raise RuntimeError(f"toxiproxy-server did not start on port {self.port}")
                time.sleep(0.02)

    def call(self, method, path, body=None):
        """One call of the HTTP API; the decoded JSON answer (None if empty). Raises
        RuntimeError for an answer that is not a success."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                text = answer.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"toxiproxy {method} {path}: {e.code} {e.read()!r}") from None
        return json.loads(text) if text.strip() else None

    def proxy(self, name, upstream, port=None):
        """A new proxy named `name` to `upstream` ("host:port"), listening on 127.0.0.1:`port`
        (a free port by default; kept when the proxy is disabled and enabled again)."""
        port = port or free_port()
        self.call("POST", "/proxies",
                  {"name": name, "listen": f"127.0.0.1:{port}", "upstream": upstream})
        return Proxy(self, name, port)

    def reset(self):
        """Every proxy enabled again, every toxic removed."""
        self.call("POST", "/reset")

    def stop(self):
        """Stops the server (by its PID) and waits for it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def toxiproxy():
    """A Toxiproxy server for one test; the test skips, saying why, only when Go is missing."""
    try:
        server = Toxiproxy()
    except Unavailable as why:
        pytest.skip(str(why))
    yield server
    server.stop()
