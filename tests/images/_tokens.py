"""A real token service for docker-registry's bearer auth (RS256 JWTs, x5c certificate)."""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any


def tokens_missing() -> str | None:
    try:
        import cryptography  # noqa: F401
        import jwt  # noqa: F401
    except ImportError as exc:
        return f"the token-service test needs PyJWT and cryptography: {exc}"
    return None


class TokenService:
    def __init__(self, root: Path, *, user: str, password: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-issuer")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = root / "token.pem"
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self._login = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.issued = 0
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if self.headers.get("Authorization") != service._login:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": service.token(query)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self._server.server_address[1]}/token"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def token(self, query: dict[str, list[str]]) -> str:
        import jwt

        access = []
        for scope in query.get("scope", []):
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {
            "iss": "test-issuer",
            "sub": "tester",
            "aud": query.get("service", [""])[0],
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        self.issued += 1
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"x5c": [self._x5c]})

    def __enter__(self) -> TokenService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
