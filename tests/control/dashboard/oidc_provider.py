"""A small OpenID Connect provider on loopback for the dashboard's single sign-on tests.

Built from joserfc (the library the dashboard verifies with): a real RSA key, discovery, a JWKS,
an authorization endpoint that signs the configured user straight in (redirecting back with a
code), and a token endpoint that checks the PKCE verifier and issues a real signed ID token.
``Provider.tamper`` lets a test change what the next token says (audience, expiry, nonce, key).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import attrs
import h11
import trio
from joserfc import jwt
from joserfc.jwk import RSAKey

from support.h11_request import read_request


@attrs.define
class Provider:
    client_id: str = "llmgw-dashboard"
    claims: dict[str, Any] = attrs.Factory(
        lambda: {"sub": "u-1", "email": "ada@example.org", "groups": ["llmgw-admins"]}
    )
    key: RSAKey = attrs.Factory(lambda: RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True))
    issuer: str = ""
    # Applied to the next ID token's claims (and cleared): a test's way to make a bad token.
    tamper: Callable[[dict[str, Any]], None] | None = None
    # Sign the next token with this key instead (a bad signature).
    signing_key: RSAKey | None = None
    codes: dict[str, dict[str, str]] = attrs.Factory(dict)
    token_requests: list[dict[str, str]] = attrs.Factory(list)

    def answer(self, method: str, target: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        parts = urlsplit(target)
        if method == "GET" and parts.path == "/.well-known/openid-configuration":
            return _json(
                {
                    "issuer": self.issuer,
                    "authorization_endpoint": f"{self.issuer}/authorize",
                    "token_endpoint": f"{self.issuer}/token",
                    "jwks_uri": f"{self.issuer}/jwks",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                    "id_token_signing_alg_values_supported": ["RS256"],
                }
            )
        if method == "GET" and parts.path == "/jwks":
            return _json({"keys": [self.key.as_dict(private=False)]})
        if method == "GET" and parts.path == "/authorize":
            q = dict(parse_qsl(parts.query))
            if q.get("client_id") != self.client_id or q.get("code_challenge_method") != "S256":
                return 400, [], b"bad authorization request"
            code = secrets.token_urlsafe(16)
            self.codes[code] = q
            location = f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q['state']})}"
            return 302, [("location", location)], b""
        if method == "POST" and parts.path == "/token":
            form = dict(parse_qsl(body.decode()))
            self.token_requests.append(form)
            asked = self.codes.pop(form.get("code", ""), None)
            verifier = form.get("code_verifier", "")
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
            redirect = form.get("redirect_uri")
            if asked is None or challenge != asked["code_challenge"] or redirect != asked["redirect_uri"]:
                return _json({"error": "invalid_grant"}, 400)
            now = int(time.time())
            claims = {
                "iss": self.issuer,
                "aud": self.client_id,
                "iat": now,
                "exp": now + 300,
                "nonce": asked["nonce"],
                **self.claims,
            }
            if self.tamper is not None:
                self.tamper(claims)
                self.tamper = None
            key, self.signing_key = self.signing_key or self.key, None
            token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, key)
            return _json({"access_token": "opaque", "token_type": "Bearer", "id_token": token})
        return 404, [], b"not found"


def _json(data: Any, status: int = 200) -> tuple[int, list[tuple[str, str]], bytes]:
    return status, [("content-type", "application/json")], json.dumps(data).encode()


async def _serve(provider: Provider, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    async with stream:
        read = await read_request(conn, stream)
        if read is None:
            return
        request, body = read
        status, headers, payload = provider.answer(request.method.decode(), request.target.decode(), body)
        await stream.send_all(
            conn.send(
                h11.Response(
                    status_code=status,
                    headers=[*headers, ("content-length", str(len(payload))), ("connection", "close")],
                )
            )
            or b""
        )
        await stream.send_all(conn.send(h11.Data(data=payload)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")


@asynccontextmanager
async def running_provider(provider: Provider | None = None) -> AsyncIterator[Provider]:
    provider = provider or Provider()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    provider.issuer = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.serve_listeners, partial(_serve, provider), listeners))
        try:
            yield provider
        finally:
            nursery.cancel_scope.cancel()
