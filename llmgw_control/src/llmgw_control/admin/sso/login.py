"""OpenID Connect login for the dashboard: authorization code flow with PKCE, ID token checked with joserfc.

``begin`` makes the authorization request (``state``, ``nonce`` and a PKCE S256 verifier, all
random) and the signed, short-lived cookie that remembers them; the provider sends the browser
back to ``/admin/login?code=…&state=…`` (the login page's own path: no new unauthenticated
route), where ``finish`` checks the state against the cookie, redeems the code at the token
endpoint with the verifier, and verifies the ID token: signature with the issuer's JWKS (from
discovery), ``iss``, ``aud`` (and ``azp`` when several audiences), ``exp``/``iat`` with a minute
of leeway, and the ``nonce``. The configured claim (groups or roles) is then mapped to admin or
read-only access; a token whose claim grants neither is refused.

Everything the provider sends is hostile input: bodies are bounded (``MAX_BODY``), every call has
a deadline and goes through one small ``CapacityLimiter``, and the endpoints discovery names
must be https (http only on loopback, for a test's provider).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import attrs
import httpx2
import trio
from joserfc import jwt
from joserfc.errors import BadSignatureError, ClaimError, ExpiredTokenError, JoseError
from joserfc.jwk import KeySet

from llmgw_shared.config import ConfigError
from llmgw_shared.jsonin import loads as json_loads

from ..org_config import OidcConfig, secure_url

# Discovery documents, key sets and token answers are a few KiB; 1 MiB bounds a hostile one.
MAX_BODY = 1024 * 1024
# One provider call may take this long (a slow provider makes a slow login, never a hung one).
CALL_DEADLINE_S = 10.0
# Logins in flight at once against the provider; more wait (a login is rare, a flood is not ours).
PROVIDER_CALLS = trio.CapacityLimiter(8)
# Discovery and keys are fetched again after an hour; an unknown ``kid`` refetches the keys at
# most once a minute (a key rotation is picked up, a token with random kids cannot hammer the provider).
METADATA_TTL_S = 3600.0
KEYS_REFRESH_MIN_S = 60.0
# The login must be completed within ten minutes of starting it.
PENDING_TTL_S = 600
# Clocks of the provider and of this host may differ by this much.
LEEWAY_S = 60
# Asymmetric algorithms only: "none" and HS256 (a shared secret an attacker may guess) are refused.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
PENDING_COOKIE = "llmgw_oidc"


class LoginRefused(Exception):
    """The login did not complete; the message is safe to show the user."""


@attrs.frozen
class Identity:
    user: str
    grants: tuple[str, ...]
    role: str  # "admin" or "read"


@attrs.frozen
class Pending:
    state: str
    nonce: str
    verifier: str
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class OidcLogin:
    def __init__(self, config: OidcConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0
        self._keys: KeySet | None = None
        self._keys_at = 0.0
        self._secret = ""
        if config.client_secret_file:
            try:
                with open(config.client_secret_file, encoding="utf-8") as f:
                    self._secret = f.read().strip()
            except OSError as exc:
                raise ConfigError(f"oidc.client_secret_file: cannot read it: {exc}") from None

    # ------------------------------------------------------------------ access

    def grants_of(self, claims: dict[str, Any]) -> tuple[str, ...]:
        value = claims.get(self.config.claim)
        values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        known = set(self.config.admin_values) | set(self.config.read_only_values)
        return tuple(sorted({v for v in values if isinstance(v, str) and v in known}))

    def role_of(self, grants: tuple[str, ...]) -> str | None:
        """``admin``, ``read`` or None (nothing granted), by the configured mapping as it is now."""
        if any(g in self.config.admin_values for g in grants):
            return "admin"
        if any(g in self.config.read_only_values for g in grants):
            return "read"
        return None

    # ------------------------------------------------------------------ the flow

    async def begin(self) -> tuple[str, Pending]:
        """The provider's authorization URL to send the browser to, and what to remember in the cookie."""
        metadata = await self.metadata()
        pending = Pending(
            secrets.token_urlsafe(24),
            secrets.token_urlsafe(24),
            secrets.token_urlsafe(48),
            self._clock() + PENDING_TTL_S,
        )
        challenge = _b64(hashlib.sha256(pending.verifier.encode()).digest())
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.config.client_id,
                "redirect_uri": self.config.redirect_url,
                "scope": " ".join(self.config.scopes),
                "state": pending.state,
                "nonce": pending.nonce,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            }
        )
        endpoint = str(metadata["authorization_endpoint"])
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}", pending

    async def finish(self, *, code: str, state: str, pending: Pending | None) -> Identity:
        if pending is None or pending.expires_at <= self._clock():
            raise LoginRefused("The sign-in took too long or was not started here; start it again.")
        if not secrets.compare_digest(state.encode(), pending.state.encode()):
            raise LoginRefused("The sign-in answer does not match the sign-in started here (state).")
        if not code or len(code) > 4096:
            raise LoginRefused("The provider sent no usable authorization code.")
        metadata = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.config.redirect_url,
            "client_id": self.config.client_id,
            "code_verifier": pending.verifier,
        }
        auth = (self.config.client_id, self._secret) if self._secret else None
        answer = await self._call("POST", str(metadata["token_endpoint"]), data=form, auth=auth)
        id_token = answer.get("id_token")
        if not isinstance(id_token, str) or len(id_token) > 64 * 1024:
            raise LoginRefused("The provider's token answer holds no ID token.")
        claims = await self._verify(id_token, pending.nonce)
        grants = self.grants_of(claims)
        role = self.role_of(grants)
        if role is None:
            raise LoginRefused(
                f"Your account is known to the provider, but its {self.config.claim!r} claim "
                "grants no access to this dashboard."
            )
        user = claims.get(self.config.user_claim)
        name = user if isinstance(user, str) and user else str(claims.get("sub", ""))
        return Identity(name[:200], grants, role)

    async def _verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        keys = await self.keys()
        try:
            try:
                token = jwt.decode(id_token, keys, algorithms=list(ALGORITHMS))
            except (JoseError, ValueError):
                # Perhaps signed with a key the provider rotated in since: fetch the keys again
                # (at most once a minute) and try once more.
                fresh = await self.keys(refresh=True)
                if fresh is keys:
                    raise
                token = jwt.decode(id_token, fresh, algorithms=list(ALGORITHMS))
            claims: dict[str, Any] = dict(token.claims)
            registry = jwt.JWTClaimsRegistry(
                now=int(self._clock()),
                leeway=LEEWAY_S,
                iss={"essential": True, "value": self.config.issuer},
                aud={"essential": True, "value": self.config.client_id},
                exp={"essential": True},
                iat={"essential": True},
                sub={"essential": True},
                nonce={"essential": True, "value": nonce},
            )
            registry.validate(claims)
        except (JoseError, ValueError, KeyError, TypeError) as exc:
            raise LoginRefused(f"The provider's ID token was refused: {_reason(exc)}.") from None
        audiences = claims.get("aud")
        if isinstance(audiences, list) and len(audiences) > 1 and claims.get("azp") != self.config.client_id:
            raise LoginRefused("The provider's ID token was refused: issued to another client (azp).")
        return claims

    # ------------------------------------------------------------------ the provider's documents

    async def metadata(self) -> dict[str, Any]:
        if self._metadata is not None and self._clock() - self._metadata_at < METADATA_TTL_S:
            return self._metadata
        issuer = self.config.issuer
        doc = await self._call("GET", issuer.rstrip("/") + "/.well-known/openid-configuration")
        if doc.get("issuer") != issuer:
            raise LoginRefused("The provider's discovery document names another issuer.")
        try:
            for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                secure_url(str(doc[field]).split("?")[0], f"discovery {field}")
        except (KeyError, ConfigError) as exc:
            raise LoginRefused(f"The provider's discovery document is unusable: {exc}") from None
        methods = doc.get("code_challenge_methods_supported")
        if isinstance(methods, list) and "S256" not in methods:
            raise LoginRefused("The provider does not support PKCE with S256.")
        self._metadata, self._metadata_at = doc, self._clock()
        return doc

    async def keys(self, *, refresh: bool = False) -> KeySet:
        fresh = self._clock() - self._keys_at < (KEYS_REFRESH_MIN_S if refresh else METADATA_TTL_S)
        if self._keys is not None and fresh:
            return self._keys
        metadata = await self.metadata()
        document = await self._call("GET", str(metadata["jwks_uri"]))
        try:
            self._keys = KeySet.import_key_set(document)  # type: ignore[arg-type]
        except (JoseError, ValueError, KeyError, TypeError) as exc:
            raise LoginRefused(f"The provider's key set is unusable: {type(exc).__name__}.") from None
        self._keys_at = self._clock()
        return self._keys

    async def _call(
        self, method: str, url: str, *, data: dict[str, str] | None = None, auth: tuple[str, str] | None = None
    ) -> dict[str, Any]:
        async with PROVIDER_CALLS:
            with trio.move_on_after(CALL_DEADLINE_S) as deadline:
                try:
                    async with (
                        httpx2.AsyncClient(timeout=CALL_DEADLINE_S, follow_redirects=False) as client,
                        client.stream(
                            method, url, data=data, auth=auth, headers={"accept": "application/json"}
                        ) as response,
                    ):
                        body = bytearray()
                        async for chunk in response.aiter_bytes():
                            body += chunk
                            if len(body) > MAX_BODY:
                                raise LoginRefused("The provider's answer is too large.")
                        status = response.status_code
                except httpx2.HTTPError as exc:
                    raise LoginRefused(f"The provider could not be reached: {type(exc).__name__}.") from None
        if deadline.cancelled_caught:
            raise LoginRefused("The provider did not answer in time.")
        if status != 200:
            raise LoginRefused(f"The provider answered {status}.")
        try:
            parsed = json_loads(bytes(body))
        except ValueError:
            raise LoginRefused("The provider's answer is not JSON.") from None
        if not isinstance(parsed, dict):
            raise LoginRefused("The provider's answer is not a JSON object.")
        return parsed


# What a refused token's claim means to the person signing in (shown on the login page).
_CLAIM_WORDS = {
    "aud": "it was issued to another client (audience)",
    "iss": "it names another issuer",
    "nonce": "it does not belong to this sign-in (nonce)",
    "exp": "it has expired",
    "iat": "its issue time is missing or in the future",
    "sub": "it names no user (sub)",
}


def _reason(exc: Exception) -> str:
    if isinstance(exc, BadSignatureError):
        return "its signature does not verify with the provider's published keys"
    if isinstance(exc, ExpiredTokenError):
        return "it has expired"
    if isinstance(exc, ClaimError):
        return _CLAIM_WORDS.get(exc.claim, f"its {exc.claim[:40]!r} claim is missing or wrong")
    return f"it is malformed ({type(exc).__name__})"


def pending_to_json(pending: Pending) -> str:
    return json.dumps(attrs.asdict(pending), separators=(",", ":"))


def pending_from_json(text: str) -> Pending | None:
    try:
        data = json_loads(text)
        return Pending(str(data["state"]), str(data["nonce"]), str(data["verifier"]), float(data["expires_at"]))
    except (ValueError, KeyError, TypeError):
        return None
