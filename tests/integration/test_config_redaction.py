"""/config (admin listener) hides a value by where it is used, not by its field's name: every
value of a route's match.headers (a value a client must send, often a shared secret), every
value the headers middleware sets or adds (request and response), and the values of secret
keys (a Redis password). Configurations are generated with a distinct secret in each such
position, in block and flow style, quoted and not, under field names that say nothing."""
import itertools
import socket

import pytest

from proxy_support import addr, free_port, gateway


NAMES = ["X-Plain", "x-canary", "Accept", "X-Tenant"]


def secrets_config(target, admin, style, quote):
    """A configuration with a secret in every value position: (its text, the secrets)."""
    counter = itertools.count()
    secrets = []

    def secret():
        value = f"s3cr3t-{next(counter)}-{style}"
        secrets.append(value)
        return f'"{value}"' if quote else value

    def fields(indent):
        if style == "flow":
            return "{" + ", ".join(f"{n}: {secret()}" for n in NAMES) + "}"
        return "".join(f"\n{' ' * indent}{n}: {secret()}" for n in NAMES)

    text = f"""servers:
  - {{name: public, listen: 127.0.0.1:0, access_log: off}}
admin: {{listen: 127.0.0.1:{admin}}}
redis:
  address: 127.0.0.1:1
  password: {secret()}
routes:
  - name: guarded
    match:
      path_prefix: /g
      headers: {fields(8)}
    middlewares:
      - headers:
          request:
            set: {fields(14)}
            add: {fields(14)}
            remove: [X-Gone]
          response:
            set: {fields(14)}
            add: {fields(14)}
    service: s
services:
  s: {{url: "http://{addr(target)}"}}
"""
    return text, secrets


def shown_config(admin):
    with socket.create_connection(("127.0.0.1", admin), timeout=5) as s:
        s.sendall(b"GET /config HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        shown = b""
        while chunk := s.recv(65536):
            shown += chunk
    return shown.decode()


@pytest.mark.parametrize("style,quote", [("block", False), ("block", True), ("flow", False),
                                         ("flow", True)])
def test_no_value_used_as_a_secret_is_shown(build_dir, tmp_path, recorder, style, quote):
    admin = free_port()
    text, secrets = secrets_config(recorder, admin, style, quote)
    server = gateway(build_dir, tmp_path, text)
    try:
        shown = shown_config(admin)
        assert shown.startswith("HTTP/1.1 200"), shown
        for value in secrets:
            assert value not in shown, (value, shown)
        assert shown.count("<redacted>") == len(secrets), shown
        # What is no secret is still there: names, paths, addresses, the fields removed.
        for kept in ["X-Plain", "x-canary", "path_prefix: /g", "X-Gone", addr(recorder),
                     "127.0.0.1:1"]:
            assert kept in shown, (kept, shown)
    finally:
        server.stop()


# ---- /config: secrets wherever they are used -------------------------------------------------


def test_config_hides_a_secret_aliased_into_another_place(build_dir, tmp_path, recorder):
    admin = free_port()
    gw = gateway(build_dir, tmp_path, f"""servers:
  - {{name: public, listen: 127.0.0.1:0, access_log: off}}
admin: {{listen: 127.0.0.1:{admin}}}
redis: {{address: 127.0.0.1:1, password: &pw alias-s3cr3t}}
routes:
  - name: r
    match: {{path_prefix: /, headers: {{X-Key: *pw}}}}
    middlewares:
      - forward_auth: {{service: auth}}
    service: s
services:
  s: {{url: "http://{addr(recorder)}"}}
  auth: {{url: "http://{addr(recorder)}"}}
""")
    try:
        shown = shown_config(admin)
        assert shown.startswith("HTTP/1.1 200"), shown
        assert "alias-s3cr3t" not in shown, shown
        assert addr(recorder) in shown
    finally:
        gw.stop()
