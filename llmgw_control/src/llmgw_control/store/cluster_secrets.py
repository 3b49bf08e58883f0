"""Secrets every control daemon on one store must share, created once in the database by the first.

Replica API keys, the key digests' server secret and the dashboard's session signing key must be
the same on every daemon of one PostgreSQL store: a new leader must talk to the engines it adopts,
check the keys the others made, and accept their sessions.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from llmgw_shared.logs import get_logger
from llmgw_shared.threads import DISK

from .interface import Store

log = get_logger(__name__)

KEY_DIGEST_SECRET = "key-digest"
REPLICA_KEY_SECRET = "shard-api-keys"


def _read_hex(path: Path) -> bytes | None:
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        return None
    except ValueError:
        raise ValueError(f"{path}: a secret file must hold hex digits") from None


async def cluster_secret(store: Store, name: str, local_file: Path) -> bytes:
    """The secret ``name`` every daemon on ``store`` shares, created in the database by the first.

    The first daemon offers the value of its local file when it has one (an installation that
    moves from one daemon to several keeps its key digests and adopted engines valid), else a
    fresh random one. A local file that disagrees with the database is reported, not used.
    """
    local = await DISK.run(_read_hex, local_file)
    offer = local if local is not None and len(local) >= 16 else secrets.token_bytes(32)
    value = await store.shared_secret(name, offer)
    if local is not None and value != local:
        log.warning(
            "%s differs from the cluster's %s secret in the store: using the store's (every "
            "daemon on one database must agree); the file is ignored",
            local_file,
            name,
        )
    return value
