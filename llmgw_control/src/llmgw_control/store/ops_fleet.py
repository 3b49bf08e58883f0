"""What the fleet leaves for the next leader: which nodes held replicas (see leadership.py).

A leader that takes over holds its placements for ``settle`` seconds so nodes can report the
engines they run before anything is started twice. Knowing which nodes held replicas lets it
stop waiting as soon as all of them have reported, instead of always waiting the whole time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from . import convert as cv
from .backend import Tx
from .errors import InvalidInput
from .ops_base import OpsBase
from .records import FleetHolders


class FleetOps(OpsBase):
    async def fleet_holders(self) -> FleetHolders | None:
        """The last set written, or None if no leader ever wrote one."""

        def read(tx: Tx) -> FleetHolders | None:
            row = tx.one("SELECT epoch, nodes, updated_at FROM fleet_holders WHERE id = 1")
            if row is None or int(row[0]) == 0:
                return None
            return FleetHolders(int(row[0]), frozenset(cv.load_json(row[1])), cv.from_us(int(row[2])))

        return await self._read(read)

    async def remember_holders(self, epoch: int, nodes: Iterable[str]) -> bool:
        """Write the set for ``epoch``; False (nothing written) when a later epoch wrote already,
        so a deposed leader that has not noticed yet cannot overwrite its successor's record."""
        epoch = cv.count("epoch", epoch, minimum=1)
        names = sorted({cv.name("nodes", n) for n in nodes})
        if len(names) > 100_000:
            raise InvalidInput("nodes", "at most 100000 node ids")

        def write(tx: Tx) -> bool:
            row = tx.one(
                "UPDATE fleet_holders SET epoch = ?, nodes = ?, updated_at = now_us() WHERE id = 1 AND epoch <= ? "
                "RETURNING epoch",
                (epoch, json.dumps(names), epoch),
            )
            return row is not None

        return await self._write(write)
