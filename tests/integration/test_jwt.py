"""The jwt middleware against tokens made by PyJWT (Debian's python3-jwt) and keys made by
python3-cryptography: HS256, RS256 and ES256 from a JWKS file; expiry, not-before, issuer,
audience; claims to request fields; and what it refuses (bad signature, expired token, alg
none, an HMAC token signed with an RSA public key, an unknown kid)."""
import base64
import json
import os
import time

import pytest

from proxy_support import SERVER, addr, gateway, middleware_config_error, request

jwt = pytest.importorskip("jwt", reason="python3-jwt (scripts/install-deps.sh test)")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, rsa  # noqa: E402


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def int_b64(n, length=None):
    return b64(n.to_bytes(length or (n.bit_length() + 7) // 8, "big"))


class Keys:
    """One key of each kind, and their JWKS document."""

    def __init__(self):
        self.secret = os.urandom(32)
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        rsa_pub = self.rsa.public_key().public_numbers()
        ec_pub = self.ec.public_key().public_numbers()
        self.jwks = {"keys": [
            {"kty": "oct", "kid": "hmac", "k": b64(self.secret)},
            {"kty": "RSA", "kid": "rsa", "use": "sig", "alg": "RS256",
             "n": int_b64(rsa_pub.n), "e": int_b64(rsa_pub.e)},
            {"kty": "EC", "kid": "ec", "crv": "P-256",
             "x": int_b64(ec_pub.x, 32), "y": int_b64(ec_pub.y, 32)},
        ]}

    def token(self, alg, claims=None, kid=None, **times):
        now = int(time.time())
        body = {"sub": "alice", "iss": "https://auth.example", "aud": "api",
                "exp": now + 300, **(claims or {})}
        for name, offset in times.items():
            body[name] = now + offset
        key = {"HS256": self.secret, "RS256": self.rsa, "ES256": self.ec}[alg]
        default_kid = {"HS256": "hmac", "RS256": "rsa", "ES256": "ec"}[alg]
        return jwt.encode(body, key, algorithm=alg, headers={"kid": kid or default_kid})


@pytest.fixture(scope="module")
def keys():
    return Keys()


def jwt_gateway(build_dir, tmp_path, keys, target, settings="", extra_middlewares=""):
    (tmp_path / "keys.json").write_text(json.dumps(keys.jwks))
    return gateway(build_dir, tmp_path, SERVER + f"""
routes:
  - name: api
    match: {{path_prefix: /}}
    middlewares:
      - jwt: {{jwks_file: keys.json, issuer: "https://auth.example", audience: [api, other],
              claims_to_headers: {{sub: x-user, role: x-role}}{settings}}}
{extra_middlewares}
    service: a
services:
  a: {{url: "http://{addr(target)}"}}
""")


def bearer(token):
    return {"Authorization": f"Bearer {token}"}



@pytest.mark.parametrize("alg", ["HS256", "RS256", "ES256"])
def test_a_good_token_goes_through_with_its_claims_as_fields(build_dir, tmp_path, keys, up, alg):
    gw = jwt_gateway(build_dir, tmp_path, keys, up)
    try:
        token = keys.token(alg, {"role": "admin"})
        # The client's own X-User is dropped; the token's claims are what goes upstream.
        status, _, body = request(gw, "GET", "/headers",
                                  headers={**bearer(token), "X-User": "mallory"})
        assert status == 200, body
        text = body.decode().lower()
        assert "x-user: alice\n" in text and "mallory" not in text, text
        assert "x-role: admin\n" in text, text
        # A token without the claim: the client's field of that name is dropped all the same.
        status, _, body = request(gw, "GET", "/headers",
                                  headers={**bearer(keys.token(alg)), "X-Role": "admin"})
        assert status == 200 and "x-role" not in body.decode().lower(), body
    finally:
        gw.stop()


@pytest.mark.parametrize("case,why", [
    ("expired", "token expired"),
    ("not_yet", "token not valid yet"),
    ("tampered", "bad signature"),
    ("other_key", "bad signature"),
    ("none", "algorithm not accepted"),
    ("confused", "bad signature"),
    ("unknown_kid", "unknown key id"),
    ("issuer", "wrong issuer"),
    ("audience", "wrong audience"),
    ("garbage", "malformed token"),
])
def test_a_bad_token_is_refused_with_why(build_dir, tmp_path, keys, up, case, why):
    other = Keys()
    tokens = {
        "expired": lambda: keys.token("ES256", exp=-10),
        "not_yet": lambda: keys.token("RS256", nbf=60),
        "tampered": lambda: tamper(keys.token("RS256")),
        "other_key": lambda: other.token("ES256"),  # same kid, another key
        "none": lambda: jwt.encode({"sub": "alice"}, None, algorithm="none"),
        # The RSA public key (as PEM) used as an HMAC secret: the classic confusion.
        "confused": lambda: hs256_raw(keys.rsa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
            kid="rsa"),
        "unknown_kid": lambda: keys.token("HS256", kid="nobody"),
        "issuer": lambda: keys.token("HS256", {"iss": "https://evil.example"}),
        "audience": lambda: keys.token("HS256", {"aud": ["web"]}),
        "garbage": lambda: "a.b",
    }
    gw = jwt_gateway(build_dir, tmp_path, keys, up)
    try:
        status, headers, body = request(gw, "GET", "/headers", headers=bearer(tokens[case]()))
        assert status == 401, body
        challenge = headers["WWW-Authenticate"]
        assert challenge.startswith('Bearer realm="spindle", error="invalid_token"'), challenge
        assert f'error_description="{why}"' in challenge, challenge
    finally:
        gw.stop()


def tamper(token):
    """The token with its payload's sub changed (signature kept)."""
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = "admin"
    return ".".join([header, b64(json.dumps(claims).encode()), signature])


def hs256_raw(secret, kid):
    """An HS256 token made by hand (PyJWT refuses a PEM key as an HMAC secret)."""
    import hashlib
    import hmac
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    payload = b64(json.dumps({"sub": "alice", "iss": "https://auth.example", "aud": "api",
                              "exp": int(time.time()) + 300}).encode())
    mac = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64(mac)}"


def test_no_token_is_a_bare_challenge_and_leeway_and_cookies_work(build_dir, tmp_path, keys, up):
    gw = jwt_gateway(build_dir, tmp_path, keys, up, settings=", leeway: 30s, cookie: session")
    try:
        status, headers, _ = request(gw, "GET", "/headers")
        assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="spindle"'
        # From the cookie (the Authorization field is not looked at then), 10 s past expiry
        # but within the leeway.
        token = keys.token("HS256", exp=-10)
        status, _, body = request(gw, "GET", "/headers",
                                  headers={"Cookie": f"theme=dark; session={token}"})
        assert status == 200, body
        status, _, _ = request(gw, "GET", "/headers",
                               headers={"Cookie": f"session={keys.token('HS256', exp=-40)}"})
        assert status == 401
        status, _, _ = request(gw, "GET", "/headers", headers=bearer(keys.token("HS256")))
        assert status == 401
    finally:
        gw.stop()


def test_a_rate_limit_counts_by_claim(build_dir, tmp_path, keys, up):
    gw = jwt_gateway(build_dir, tmp_path, keys, up, extra_middlewares=(
        "      - rate_limit: {key: 'claim:sub', rate: 1/m, burst: 2}"))
    try:
        alice, bob = keys.token("HS256"), keys.token("HS256", {"sub": "bob"})
        got = [request(gw, "GET", "/headers", headers=bearer(t))[0]
               for t in (alice, alice, alice, bob, bob, bob)]
        assert got == [200, 200, 429, 200, 200, 429], got
    finally:
        gw.stop()


@pytest.mark.parametrize("jwks,middleware,why", [
    (None, "{jwt: {jwks_file: nowhere.json}}", "jwt.jwks_file: cannot read"),
    ('{"keys": [{"kty": "oct", "k": "c2hvcnQ"}]}', "{jwt: {jwks_file: keys.json}}",
     "keys[0].k: an HS256 key needs at least 32 bytes"),
    ('{"keys": [{"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"}]}',
     "{jwt: {jwks_file: keys.json}}", "keys[0].crv: only P-256"),
    ('{"keys": [{"kty": "EC", "crv": "P-256", "x": "' + "A" * 43 + '", "y": "' + "A" * 43 + '"}]}',
     "{jwt: {jwks_file: keys.json}}", "keys[0]: not a valid EC public key"),
    ('{"keys": []}', "{jwt: {jwks_file: keys.json}}", "no keys"),
    ("{", "{jwt: {jwks_file: keys.json}}", "not JSON"),
    ('{"keys": [{"kty": "oct", "k": "' + "A" * 43 + '"}]}',
     "{jwt: {jwks_file: keys.json, algorithms: [HS512]}}", "jwt.algorithms: 'HS512'"),
    ('{"keys": [{"kty": "oct", "k": "' + "A" * 43 + '"}]}',
     "{rate_limit: {key: 'claim:sub', rate: 1/s}}",
     "rate_limit.key: a claim is known only after a jwt"),
])
def test_a_bad_jwt_setting_is_a_configuration_error(build_dir, tmp_path, jwks, middleware, why):
    if jwks is not None:
        (tmp_path / "keys.json").write_text(jwks)
    err = middleware_config_error(build_dir, tmp_path, f"[{middleware}]")
    assert f"bad.yaml:5: routes[0].middlewares[0]." in err and why in err, err
