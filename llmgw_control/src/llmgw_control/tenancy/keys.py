"""Client API keys: how a secret is made, how it is digested, how it is read from a request.

A key is ``sk-llmgw-`` followed by 32 random bytes (256 bits) in URL-safe base64. The shared
log scrubber redacts anything with that prefix, so a key that slips into a message is still
not written out.

The store keeps only a digest. It is an HMAC-SHA256 under a server secret rather than a slow
password hash (bcrypt, argon2): the digest is computed on every request, and a password hash
protects *guessable* secrets, which 256 random bits are not. The server secret adds defence in
depth: a stolen copy of the database alone does not let anyone test candidate keys offline.
Every control daemon sharing one database must use the same server secret; the digest names the
secret it was made with (``hs256:<secret id>:<hex>``) so a mismatch is detected and logged at
start instead of showing up as mysterious 401s.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

KEY_PREFIX = "sk-llmgw-"
# Anything longer cannot be one of our keys: refuse it before spending an HMAC on it.
MAX_KEY_LENGTH = 256
_SECRET_BYTES = 32


def new_key_secret() -> str:
    """A fresh client key (256 random bits), to show once and then forget."""
    return KEY_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None when there is none."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


class KeyDigester:
    """Turns a key secret into the digest stored and looked up (HMAC-SHA256 under a server secret)."""

    def __init__(self, server_secret: bytes) -> None:
        if not isinstance(server_secret, bytes) or len(server_secret) < 16:
            raise ValueError("the server secret must be at least 16 bytes")
        # Keyed once: copying a keyed HMAC skips re-hashing the key on every request.
        self._mac = hmac.new(server_secret, digestmod=hashlib.sha256)
        # A short public fingerprint of the secret (not the secret: SHA-256 of 16+ random bytes
        # reveals nothing useful), so a digest says which secret made it.
        self.secret_id = hashlib.sha256(b"llmgw key secret id\0" + server_secret).hexdigest()[:8]
        self._prefix = f"hs256:{self.secret_id}:"

    def digest(self, key_secret: str) -> str:
        mac = self._mac.copy()
        mac.update(key_secret.encode("utf-8", "surrogatepass"))
        return self._prefix + mac.hexdigest()

    def made_here(self, digest: str) -> bool:
        """True when ``digest`` was made with this server secret (so a matching key can be found)."""
        return digest.startswith(self._prefix)


def load_or_create_server_secret(path: str | Path) -> bytes:
    """Read the server secret from ``path``, creating it (mode 0600, 32 random bytes) if absent.

    Blocking file I/O: call it while building the daemon, before the nursery runs (or through
    ``trio.to_thread``). Daemons sharing a database need the same file contents.
    """
    path = Path(path)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = secrets.token_hex(_SECRET_BYTES)
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: two daemons starting at once must not each write their own secret.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            text = path.read_text().strip()
        else:
            with os.fdopen(fd, "w") as f:
                f.write(text + "\n")
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path}: the key secret file must hold hex digits") from None
    if len(secret) < 16:
        raise ValueError(f"{path}: the key secret must be at least 16 bytes (32 hex digits)")
    return secret
