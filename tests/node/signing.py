"""An operator's minisign key for the tests, made with ``cryptography`` (the node verifies with it too).

The format is checked against the real ``minisign`` tool in test_release_signing.py when it is
installed, so these helpers cannot drift from what operators' signatures look like.
"""

from __future__ import annotations

import base64
import hashlib
import os

import attrs
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


@attrs.frozen
class OperatorKey:
    private: Ed25519PrivateKey
    key_id: bytes

    @classmethod
    def new(cls) -> OperatorKey:
        return cls(Ed25519PrivateKey.generate(), os.urandom(8))

    @property
    def public(self) -> str:
        """The base64 line of the key's minisign .pub file (what release_signing_keys holds)."""
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.b64encode(b"Ed" + self.key_id + raw).decode()

    @property
    def id_text(self) -> str:
        return f"{int.from_bytes(self.key_id, 'little'):016X}"

    def sign(
        self,
        data: bytes,
        *,
        prehashed: bool = True,
        comment: str = "timestamp:1 file:index.json hashed",
        key_id: bytes | None = None,
    ) -> bytes:
        """A minisign signature file over ``data`` (``ED``: BLAKE2b-512 first, minisign's default)."""
        message = hashlib.blake2b(data, digest_size=64).digest() if prehashed else data
        sig = self.private.sign(message)
        algorithm = b"ED" if prehashed else b"Ed"
        global_sig = self.private.sign(sig + comment.encode())
        return (
            f"untrusted comment: signature from the tests\n"
            f"{base64.b64encode(algorithm + (key_id or self.key_id) + sig).decode()}\n"
            f"trusted comment: {comment}\n"
            f"{base64.b64encode(global_sig).decode()}\n"
        ).encode()
