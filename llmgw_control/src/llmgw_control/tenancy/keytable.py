"""The key table in memory: digest → what admission needs to know about the key.

Built from the store's ``ApiKey`` rows and kept current with ``Store.keys_changed_since``.
Looking a key up is one HMAC and one dict lookup. The dict compares *digests*, which an
attacker cannot choose (they are keyed), so lookup timing reveals nothing about stored keys.
"""

from __future__ import annotations

import attrs

from ..store import ApiKey, KeyChanges


@attrs.frozen
class KeyEntry:
    """An ``ApiKey`` reduced to what the data path checks, in the cheapest form to check."""

    id: str
    name: str
    group_id: str
    # None: every model.
    models: frozenset[str] | None
    admin: bool
    # Unix seconds, compared with the admission clock.
    expires_at: float | None
    # A revoked key stays in the table (so "revoked" can be told apart from "unknown", and so a
    # table of only revoked keys still closes the gateway).
    revoked: bool

    @classmethod
    def of(cls, key: ApiKey) -> KeyEntry:
        return cls(
            id=key.id,
            name=key.name,
            group_id=key.group_id,
            models=None if key.models is None else frozenset(key.models),
            admin=key.admin,
            expires_at=None if key.expires_at is None else key.expires_at.timestamp(),
            # Revoked from the moment the row says so, whatever the clocks: trusting a revocation
            # time in the "future" (a database clock ahead of ours) would keep a revoked key alive.
            revoked=key.revoked_at is not None,
        )

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class KeyTable:
    def __init__(self) -> None:
        self._by_digest: dict[str, KeyEntry] = {}
        self._digest_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def get(self, digest: str) -> KeyEntry | None:
        return self._by_digest.get(digest)

    def digests(self) -> list[str]:
        return list(self._by_digest)

    def by_id(self, key_id: str) -> KeyEntry | None:
        digest = self._digest_of.get(key_id)
        return None if digest is None else self._by_digest.get(digest)

    def apply(self, changes: KeyChanges) -> None:
        if changes.reset:
            self._by_digest.clear()
            self._digest_of.clear()
        for key in changes.changed:
            self._drop(key.id)
            self._by_digest[key.digest] = KeyEntry.of(key)
            self._digest_of[key.id] = key.digest
        for key_id in changes.deleted:
            self._drop(key_id)

    def _drop(self, key_id: str) -> None:
        digest = self._digest_of.pop(key_id, None)
        if digest is not None:
            self._by_digest.pop(digest, None)
