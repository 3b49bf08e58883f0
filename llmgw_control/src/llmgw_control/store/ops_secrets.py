"""Cluster secrets: random values every control daemon sharing the database must agree on.

The first daemon to ask for a name offers a value and the database keeps the first offer
(``INSERT … ON CONFLICT DO NOTHING`` then a read in the same transaction), so daemons starting
together still end up with one value and nobody needs to copy files between machines.
"""

from __future__ import annotations

from . import convert as cv
from .backend import Tx
from .errors import InvalidInput
from .ops_base import OpsBase


class SecretOps(OpsBase):
    async def shared_secret(self, name: str, offer: bytes) -> bytes:
        """The value stored under ``name``; ``offer`` becomes it if there is none yet."""
        name = cv.name("name", name)
        if not isinstance(offer, bytes) or len(offer) < 16:
            raise InvalidInput("offer", "must be at least 16 bytes")

        def get_or_create(tx: Tx) -> bytes:
            tx.run(
                "INSERT INTO cluster_secrets (name, value, created_at) VALUES (?, ?, now_us()) "
                "ON CONFLICT (name) DO NOTHING",
                (name, offer.hex()),
            )
            row = tx.one("SELECT value FROM cluster_secrets WHERE name = ?", (name,))
            assert row is not None
            return bytes.fromhex(row[0])

        return await self._write(get_or_create)
