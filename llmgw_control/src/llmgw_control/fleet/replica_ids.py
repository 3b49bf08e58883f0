"""Replica ids and replica API keys, both derived from the cluster secret (HMAC).

Replica API keys are an HMAC of the replica id, so after a control restart the gateway can talk to
the engines it adopts without the nodes ever sending a key back. A replica id is
``<slug>-<nonce>-<tag>``, the tag an HMAC of the profile key, the nonce and the node id, so a node
can only get a replica adopted that control minted for that very node, and the profile it belongs
to is found from the tag, not from a slug two profiles could share.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_NONCE = re.compile(r"[0-9a-f]{8}")
_TAG = re.compile(r"[0-9a-f]{16}")
# The human-readable head of a replica id; the node accepts ids of up to 128 characters and the
# nonce and tag take 26 of them.
_SLUG_CHARS = 96


def _slug(profile_key: str) -> str:
    return _UNSAFE.sub("-", profile_key)[:_SLUG_CHARS]


class ReplicaIds:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def api_key(self, replica_id: str) -> str:
        """The bearer key of ``replica_id``'s engine, derived: an adopted engine needs no key exchange."""
        return hmac.new(self._secret, replica_id.encode(), hashlib.sha256).hexdigest()[:48]

    def new(self, profile_key: str, node_id: str) -> str:
        """``<slug of the profile key>-<nonce>-<tag>``: the tag binds the id to its profile and its node."""
        nonce = secrets.token_hex(4)
        return f"{_slug(profile_key)}-{nonce}-{self._id_tag(profile_key, nonce, node_id)}"

    def _id_tag(self, profile_key: str, nonce: str, node_id: str) -> str:
        # "shard-id" and the NUL separators keep this apart from the API keys (an HMAC of the id,
        # which cannot contain a NUL) and make (profile key, nonce, node) unambiguous.
        message = f"shard-id\0{profile_key}\0{nonce}\0{node_id}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:16]

    def minted_for(self, replica_id: str, node_id: str, profile_keys: Iterable[str]) -> str | None:
        """The profile key (of ``profile_keys``) control minted ``replica_id`` for on ``node_id``; None when it did not.

        A node cannot forge an id (the tag needs the cluster secret) or borrow one minted for
        another node, and two profiles whose names slug alike (model ``a`` profile ``b-c``, model
        ``a-b`` profile ``c``) are told apart by the tag.
        """
        stem, _, rest = replica_id.rpartition("-")
        stem, _, nonce = stem.rpartition("-")
        tag = rest
        if not stem or not _NONCE.fullmatch(nonce) or not _TAG.fullmatch(tag):
            return None
        for profile_key in profile_keys:
            if _slug(profile_key) == stem and hmac.compare_digest(tag, self._id_tag(profile_key, nonce, node_id)):
                return profile_key
        return None
