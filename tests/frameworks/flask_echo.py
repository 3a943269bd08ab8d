"""A Flask app (Debian's python3-flask, on Werkzeug's server) behind spindle in the tests: it
answers every request with what it understood of it, as JSON, and prints the same as a line
(the fields tests/integration/test_framework_upstreams.py compares with what the gateway
judged). An upgrade to WebSocket is answered the same way (Werkzeug's server does not switch).
As an auth service (forward_auth), GET /verify is 200 with X-User: U for "Authorization: Bearer
ok-U" and 401 otherwise.

Usage: flask_echo.py NAME; prints {"address": "127.0.0.1:PORT"} once listening."""
import json
import sys

from flask import Flask, jsonify, request
from werkzeug.serving import make_server

app = Flask(__name__)


@app.route("/", defaults={"rest": ""}, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE",
                                                "OPTIONS", "PURGE"])
@app.route("/<path:rest>", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
                                    "PURGE"])
def understood(rest):
    auth = request.authorization
    seen = {
        "framework": sys.argv[1],
        "method": request.method,
        "host": request.host,
        "path": request.path,
        "query": request.query_string.decode("latin-1"),
        "authorization": request.headers.get("Authorization"),
        "basic_user": auth.username if auth is not None and auth.type == "basic" else None,
        "user": request.headers.get("X-User"),
        "role": request.headers.get("X-Role"),
        "cookies": request.cookies.to_dict(),
        "request_id": request.headers.get("X-Request-Id"),
        "forwarded_for": request.headers.get("X-Forwarded-For"),
        "forwarded_host": request.headers.get("X-Forwarded-Host"),
        "forwarded_proto": request.headers.get("X-Forwarded-Proto"),
        "forwarded_uri": request.headers.get("X-Forwarded-Uri"),
        "forwarded_method": request.headers.get("X-Forwarded-Method"),
        "fields": [[k, v] for k, v in request.headers.items()],
    }
    print(json.dumps(seen), flush=True)
    if request.path == "/verify":
        granted = (seen["authorization"] or "").removeprefix("Bearer ok-")
        if granted == seen["authorization"] or not granted:
            return "who are you?", 401
        return "", 200, {"X-User": granted}
    return jsonify(seen)


if __name__ == "__main__":
    server = make_server("127.0.0.1", 0, app, threaded=True)
    print(json.dumps({"address": f"127.0.0.1:{server.server_port}"}), flush=True)
    server.serve_forever()
