"""Key secrets, digests, the Authorization header, the server secret file, the key table."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from llmgw_control.store import ApiKey, KeyChanges
from llmgw_control.tenancy import KeyDigester, KeyTable, bearer_token, load_or_create_server_secret, new_key_secret
from llmgw_shared.logs import redact


def test_secrets_are_random_prefixed_and_scrubbed_from_logs() -> None:
    a, b = new_key_secret(), new_key_secret()
    assert a != b
    assert re.fullmatch(r"sk-llmgw-[A-Za-z0-9_\-]{43}", a)  # 32 bytes = 256 bits
    assert a not in redact(f"oops, logged {a} and Bearer {b}")
    assert b not in redact(f"oops, logged {a} and Bearer {b}")


def test_digest_is_keyed_and_names_its_secret() -> None:
    one = KeyDigester(b"1" * 32)
    two = KeyDigester(b"2" * 32)
    secret = new_key_secret()
    assert one.digest(secret) == one.digest(secret)
    assert one.digest(secret) != two.digest(secret)
    assert secret not in one.digest(secret)
    assert one.made_here(one.digest(secret))
    assert not two.made_here(one.digest(secret))
    with pytest.raises(ValueError):
        KeyDigester(b"short")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer sk-llmgw-abc", "sk-llmgw-abc"),
        ("bearer   sk-llmgw-abc  ", "sk-llmgw-abc"),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer", None),
        ("Bearer ", None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_server_secret_file_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "data" / "key-secret"
    first = load_or_create_server_secret(path)
    assert len(first) == 32
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert load_or_create_server_secret(path) == first
    path.write_text("not hex\n")
    with pytest.raises(ValueError, match="hex"):
        load_or_create_server_secret(path)
    path.write_text("abcd\n")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        load_or_create_server_secret(path)


def _key(key_id: str, digest: str, *, revoked: bool = False, revision: int = 1) -> ApiKey:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return ApiKey(key_id, "n", "g", digest, None, False, now, None, now if revoked else None, revision)


def test_key_table_merges_changes_and_resets() -> None:
    table = KeyTable()
    table.apply(KeyChanges(2, (_key("a", "da"), _key("b", "db")), (), reset=True))
    assert len(table) == 2
    table.apply(KeyChanges(4, (_key("a", "da", revoked=True, revision=3),), ("b",)))
    entry = table.get("da")
    assert entry is not None and entry.revoked
    assert table.get("db") is None and table.by_id("b") is None
    # A key whose digest changed is found under the new one only.
    table.apply(KeyChanges(5, (_key("a", "da2", revision=5),), ()))
    assert table.get("da") is None and table.get("da2") is not None
    table.apply(KeyChanges(6, (_key("c", "dc"),), (), reset=True))
    assert table.digests() == ["dc"]
