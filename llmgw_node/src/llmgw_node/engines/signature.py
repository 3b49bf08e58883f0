"""The operator's signature on a release index: minisign's format, verified with ``cryptography``.

A release index lists every archive's sha256, so a signature over the index's exact bytes pins
the archives too: a mirror, a proxy or control itself cannot swap one without the operator's
secret key, which never leaves the operator's machine. The format is minisign's (Ed25519), so
the operator signs with the stock tool (``minisign -Sm index.json``, Debian's ``minisign``
package) and the node needs nothing but ``cryptography`` to check it.

A public key (the second line of a minisign ``.pub`` file, e.g. ``RWQf6LRCGA9i53mlYecO4IzT51TG...``)
is base64 of ``"Ed" || key id (8 bytes) || Ed25519 public key (32 bytes)``. A signature file is::

    untrusted comment: <anything>
    base64("Ed" or "ED" || key id || Ed25519 signature (64 bytes))
    trusted comment: <text>
    base64(Ed25519 signature over the signature above and the trusted comment's text)

``Ed`` signs the file itself, ``ED`` (minisign's default since 0.8) its BLAKE2b-512 digest. Both
signatures must verify: the second makes the trusted comment (which minisign fills with a
timestamp and the file name) as authentic as the file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

# A minisign signature file is four short lines (about 300 bytes with minisign's own comments);
# anything past this is not one and is not read further.
MAX_SIGNATURE_BYTES = 4096
# Tools and people name minisign keys by this id, printed as 16 upper-case hex digits.
_KEY_BYTES = 2 + 8 + 32
_SIG_BYTES = 2 + 8 + 64


class SignatureError(Exception):
    """A signature that is missing, malformed, by another key, or does not verify; the text says which."""


@attrs.frozen
class PublicKey:
    key_id: bytes = attrs.field(repr=False)
    key: Ed25519PublicKey = attrs.field(repr=False, eq=False)

    @property
    def id_text(self) -> str:
        return key_id_text(self.key_id)


def key_id_text(key_id: bytes) -> str:
    """The id as minisign prints it: the 8 bytes read little-endian, in upper-case hex."""
    return f"{int.from_bytes(key_id, 'little'):016X}"


def parse_public_key(text: str) -> PublicKey:
    """A key from the base64 line of a minisign ``.pub`` file (the whole file is accepted too)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if lines and lines[0].startswith("untrusted comment:"):
        lines = lines[1:]
    if len(lines) != 1:
        raise SignatureError("a minisign public key is one base64 line (the second line of its .pub file)")
    raw = _b64(lines[0], "public key")
    if len(raw) != _KEY_BYTES or raw[:2] != b"Ed":
        raise SignatureError(
            f"not a minisign Ed25519 public key ({len(raw)} bytes; one is {_KEY_BYTES} starting with 'Ed')"
        )
    return PublicKey(key_id=raw[2:10], key=Ed25519PublicKey.from_public_bytes(raw[10:]))


@attrs.frozen
class Verified:
    """A signature that verified: by which key, with which trusted comment."""

    key_id: str
    trusted_comment: str


def verify(data: bytes, signature: bytes, keys: list[PublicKey]) -> Verified:
    """Check ``signature`` (a minisign signature file) over ``data`` against ``keys``.

    Returns who signed; raises ``SignatureError`` saying what is wrong otherwise. The key is
    chosen by the signature's key id, so a signature by a key not in ``keys`` is named as such.
    """
    if len(signature) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"the signature is {len(signature)} bytes; a minisign signature is a few hundred")
    try:
        lines = signature.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise SignatureError("the signature is not text (a minisign signature file is four lines)") from None
    if len(lines) < 4 or not lines[0].startswith("untrusted comment:") or not lines[2].startswith("trusted comment: "):
        raise SignatureError(
            "not a minisign signature file (four lines: untrusted comment, signature, "
            "trusted comment, global signature)"
        )
    raw = _b64(lines[1].strip(), "signature")
    if len(raw) != _SIG_BYTES or raw[:2] not in (b"Ed", b"ED"):
        raise SignatureError("not a minisign Ed25519 signature")
    algorithm, key_id, sig = raw[:2], raw[2:10], raw[10:]
    key = next((k for k in keys if k.key_id == key_id), None)
    if key is None:
        known = ", ".join(k.id_text for k in keys)
        raise SignatureError(f"signed by key {key_id_text(key_id)}, which is not one of release_signing_keys ({known})")
    signed = hashlib.blake2b(data, digest_size=64).digest() if algorithm == b"ED" else data
    try:
        key.key.verify(sig, signed)
    except InvalidSignature:
        raise SignatureError(
            f"the signature by key {key.id_text} does not match the index "
            "(it was changed after signing, or signed wrongly)"
        ) from None
    comment = lines[2][len("trusted comment: ") :]
    global_sig = _b64(lines[3].strip(), "global signature")
    try:
        key.key.verify(global_sig, sig + comment.encode("utf-8"))
    except InvalidSignature:
        raise SignatureError(
            f"the trusted comment of the signature by key {key.id_text} was changed after signing"
        ) from None
    return Verified(key_id=key.id_text, trusted_comment=comment)


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"the {what} is not base64") from None


def signature_url(index_url: str) -> str:
    """Where the signature of ``index_url`` is: the same URL with ``.minisig`` after its path."""
    base, sep, query = index_url.partition("?")
    return f"{base}.minisig{sep}{query}"
