"""POST /models with weights whose GGUF header is hostile: a 400 naming the field, not a 500
(issue 29 §6). The reader's own bounds are tested in tests/control/test_gguf_bounds.py."""

from __future__ import annotations

import struct
from pathlib import Path

from .conftest import Daemon, model_doc


def _deep_header(depth: int) -> bytes:
    # One metadata key whose value is an array of an array of ... ``depth`` deep.
    nested = b"".join(struct.pack("<IQ", 9, 1) for _ in range(depth - 1)) + struct.pack("<IQ", 4, 0)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"evil" + struct.pack("<I", 9) + nested


async def test_a_model_whose_gguf_header_is_nested_3000_deep_is_a_400(daemon: Daemon, tmp_path: Path) -> None:
    weights = tmp_path / "evil.gguf"
    weights.write_bytes(_deep_header(3000))
    doc = model_doc("evil", ram_mib=0)
    doc["profiles"][0]["weights"]["url"] = str(weights)
    answer = await daemon.admin.post("/models", json=doc)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["field"] == "profiles[0].weights.url"
    assert "metadata 'evil': arrays nested more than 8 deep" in error["message"]
    assert (await daemon.admin.get("/models/evil")).status_code == 404
    # A changed definition pointing at it is refused the same way.
    assert (await daemon.admin.post("/models", json=model_doc("fine"))).status_code == 201
    doc["name"] = "fine"
    refused = await daemon.admin.put("/models/fine", json=doc)
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "profiles[0].weights.url"


async def test_a_file_that_is_no_gguf_is_still_estimated_from_its_size(daemon: Daemon, tmp_path: Path) -> None:
    weights = tmp_path / "plain.gguf"
    weights.write_bytes(b"not a gguf header at all")
    doc = model_doc("plain", ram_mib=0)
    doc["profiles"][0]["weights"]["url"] = str(weights)
    assert (await daemon.admin.post("/models", json=doc)).status_code == 201
