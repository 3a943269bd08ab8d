"""A route sees the path its upstream gets: dot segments and escapes cannot take a request past
a route's auth; escaped slashes are kept only by option."""
import base64
import hashlib

from proxy_support import gateway, one_route, raw, request


def test_dot_segments_and_escapes_cannot_bypass_a_routes_auth(build_dir, tmp_path, recorder):
    users = tmp_path / "users"
    sha = base64.b64encode(hashlib.sha1(b"secret").digest()).decode()
    users.write_text(f"admin:{{SHA}}{sha}\n")
    routes = f"""  - name: admin
    match: {{path_prefix: /admin/}}
    middlewares: [{{basic_auth: {{users_file: {users}}}}}]
    service: s
  - {{name: api, match: {{path_prefix: /api/}}, service: s}}
"""
    server = gateway(build_dir, tmp_path, one_route(recorder, routes=routes))
    try:
        for target in ["/api/../admin/x", "/api/%2e%2e/admin/x", "/api/%2E%2e/admin/x",
                       "/api/.%2e/admin/x", "/api//../admin/x", "//admin/x", "/api/./../admin/x",
                       "/%61dmin/x", "/api/..%2fadmin/x", "/api/..%5cadmin/x",
                       "/api/..\\admin/x", "/api/%2e%2e%2fadmin/x"]:
            got = raw(server, f"GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
                      .encode())
            status = int(got.split(b" ", 2)[1])
            # The admin route's auth answers (401), or the target is refused (400): never the
            # upstream unauthenticated.
            assert status in (400, 401), (target, got[:200])
        assert not [t for t in recorder.targets() if "admin" in t], recorder.targets()
        # The upstream sees the path that was routed: normalised.
        status, _, _ = request(server, "GET", "/api/./v1/../items?q=../x")
        assert status == 200
        assert recorder.targets()[-1] == "GET /api/items?q=../x HTTP/1.1"
        # And with credentials, the normalised admin path goes through.
        auth = base64.b64encode(b"admin:secret").decode()
        status, _, _ = request(server, "GET", "/api/../admin/x",
                               headers={"Authorization": f"Basic {auth}"})
        assert status == 200
        assert recorder.targets()[-1] == "GET /admin/x HTTP/1.1"
    finally:
        server.stop()


def test_escaped_slashes_can_be_kept_by_option(build_dir, tmp_path, recorder):
    extra = "    paths: {escaped_slashes: keep, merge_slashes: false}\n"
    server = gateway(build_dir, tmp_path, one_route(recorder, extra_server=extra))
    try:
        status, _, _ = request(server, "GET", "/files/a%2fb//c/./d")
        assert status == 200
        assert recorder.targets()[-1] == "GET /files/a%2Fb//c/d HTTP/1.1"
    finally:
        server.stop()
