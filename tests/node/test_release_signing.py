"""Signed release indexes: a node with release_signing_keys installs only from an index its
operator signed (minisign format), and records who signed it.

The real llama-server archive is installed from a GitHub-shaped index served on 127.0.0.1; the
signatures are made by ``node.signing`` (cryptography) and, where the ``minisign`` tool is
installed, by the tool itself, so the format is the one operators really produce.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from node.conftest import TAG
from node.release_server import FileServer
from node.signing import OperatorKey

from llmgw_node.config import ConfigError, parse_config
from llmgw_node.engines.manager import EngineManager
from llmgw_node.engines.release import Platform
from llmgw_node.engines.signature import SignatureError, parse_public_key, signature_url, verify
from llmgw_shared.wire import EngineSpec

CPU = Platform(os="linux", arch="x86_64", cuda=False)
KEY = OperatorKey.new()
OTHER = OperatorKey.new()
DATA = b'{"tag_name": "b1", "assets": []}'


# --------------------------------------------------------------------------- the format


@pytest.mark.parametrize("prehashed", [True, False])
def test_a_good_signature_verifies_and_names_its_key(prehashed: bool) -> None:
    verified = verify(
        DATA, KEY.sign(DATA, prehashed=prehashed), [parse_public_key(OTHER.public), parse_public_key(KEY.public)]
    )
    assert verified.key_id == KEY.id_text
    assert verified.trusted_comment == "timestamp:1 file:index.json hashed"


def test_every_kind_of_bad_signature_is_refused_with_its_reason() -> None:
    keys = [parse_public_key(KEY.public)]
    good = KEY.sign(DATA).decode().splitlines()
    cases = {
        # The index changed after it was signed (one asset's digest swapped, say).
        "does not match the index": KEY.sign(DATA + b" "),
        "not one of release_signing_keys": OTHER.sign(DATA),
        # The right key id, the wrong key: a forger who copied the id.
        "by key": OTHER.sign(DATA, key_id=KEY.key_id),
        "trusted comment of the signature": "\n".join([*good[:2], "trusted comment: timestamp:2", good[3]]).encode(),
        "not a minisign signature file": b"garbage",
        "not base64": "\n".join([good[0], "!!!", *good[2:]]).encode(),
        "not text": b"\xff\xfe" * 10,
        "a few hundred": b"x" * 5000,
    }
    for reason, signature in cases.items():
        with pytest.raises(SignatureError, match=reason):
            verify(DATA, signature, keys)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(position=st.integers(min_value=0), value=st.integers(min_value=0, max_value=255))
def test_no_single_byte_change_to_a_signature_verifies(position: int, value: int) -> None:
    signature = bytearray(KEY.sign(DATA))
    position %= len(signature)
    if signature[position] == value:
        return
    signature[position] = value
    try:
        verified = verify(DATA, bytes(signature), [parse_public_key(KEY.public)])
    except SignatureError:
        return
    # base64 has slack in its last character's low bits and comments are not signed: only a
    # change that decodes to the same signature may still pass.
    assert verified.key_id == KEY.id_text
    lines = bytes(signature).decode().splitlines()
    original = KEY.sign(DATA).decode().splitlines()
    assert base64.b64decode(lines[1]) == base64.b64decode(original[1])
    assert base64.b64decode(lines[3]) == base64.b64decode(original[3])


def test_public_keys_are_checked_when_the_config_loads() -> None:
    assert parse_config({"release_signing_keys": [KEY.public]}).signing_keys[0].id_text == KEY.id_text
    # The whole .pub file is accepted too: what `minisign -G` writes.
    pub = f"untrusted comment: minisign public key {KEY.id_text}\n{KEY.public}\n"
    assert parse_public_key(pub).id_text == KEY.id_text
    for bad, reason in [
        ("not base64!", "not base64"),
        (base64.b64encode(b"Ed" + b"x" * 10).decode(), "42"),
        ("", "one base64 line"),
    ]:
        with pytest.raises(ConfigError, match=rf"release_signing_keys\[0\]: .*{reason}"):
            parse_config({"release_signing_keys": [bad]})


def test_the_signature_sits_beside_the_index_url() -> None:
    assert signature_url("http://h/releases/llama.cpp/b1") == "http://h/releases/llama.cpp/b1.minisig"
    assert signature_url("http://h/index.json?token=x") == "http://h/index.json.minisig?token=x"


@pytest.mark.skipif(
    shutil.which("minisign") is None,
    reason="the minisign tool is not installed (apt-get install minisign) to check the format against",
)
@pytest.mark.parametrize("legacy", [False, True])
def test_signatures_made_by_the_minisign_tool_verify(tmp_path: Path, legacy: bool) -> None:
    secret, public = tmp_path / "key", tmp_path / "key.pub"
    subprocess.run(["minisign", "-G", "-W", "-s", str(secret), "-p", str(public)], check=True, capture_output=True)
    index = tmp_path / "index.json"
    index.write_bytes(DATA)
    subprocess.run(
        ["minisign", "-S", *(["-l"] if legacy else []), "-s", str(secret), "-m", str(index), "-t", "llama.cpp b1"],
        check=True,
        capture_output=True,
    )
    key = parse_public_key(public.read_text())
    signature = (tmp_path / "index.json.minisig").read_bytes()
    assert verify(DATA, signature, [key]).trusted_comment == "llama.cpp b1"
    with pytest.raises(SignatureError, match="does not match"):
        verify(DATA.replace(b"b1", b"b2"), signature, [key])
    # And the other way round: minisign accepts what the tests' key signs.
    ours = OperatorKey.new()
    (tmp_path / "ours.pub").write_text(f"untrusted comment: minisign public key {ours.id_text}\n{ours.public}\n")
    (tmp_path / "index.json.minisig").write_bytes(ours.sign(DATA, prehashed=not legacy))
    subprocess.run(
        ["minisign", "-V", "-p", str(tmp_path / "ours.pub"), "-m", str(index)], check=True, capture_output=True
    )


# --------------------------------------------------------------------------- installs


def _manager(tmp_path: Path, client: httpx2.AsyncClient, *keys: OperatorKey) -> EngineManager:
    return EngineManager(tmp_path / "data", client, CPU, signing_keys=[parse_public_key(k.public) for k in keys])


async def test_a_signed_index_installs_and_the_signer_is_recorded(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    files.add_signature(TAG, KEY.sign(files.index_bytes(TAG)))
    async with httpx2.AsyncClient() as client:
        state = await _manager(tmp_path, client, OTHER, KEY).install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "installed", state.describe()
    assert state.provenance is not None and state.provenance.signed_by == KEY.id_text
    folder = tmp_path / "data" / "engines" / "llama.cpp" / TAG
    # The index and its signature stay with the install, for `engines check`.
    assert (folder / ".llmgw-index.json").read_bytes() == files.index_bytes(TAG)
    assert verify(
        files.index_bytes(TAG), (folder / ".llmgw-index.json.minisig").read_bytes(), [parse_public_key(KEY.public)]
    )


@pytest.mark.parametrize("case", ["unsigned", "wrong key", "tampered", "other tag", "garbage"])
async def test_a_node_with_keys_refuses_indexes_that_are_not_signed_by_them(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes], case: str
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    index = files.index_bytes(TAG)
    if case == "wrong key":
        files.add_signature(TAG, OTHER.sign(index))
    elif case == "tampered":
        # Signed, then an asset's digest changed: what a mirror swapping the archive would do.
        files.add_signature(TAG, KEY.sign(index))
        listed = files.releases[files.index_path(TAG)]["assets"][0]
        listed["digest"] = "sha256:" + "0" * 64
    elif case == "other tag":
        # A genuinely signed index for another version, served under this version's URL.
        older = json.loads(index)
        older["tag_name"] = "b1"
        files.releases[files.index_path(TAG)] = older
        files.add_signature(TAG, KEY.sign(files.index_bytes(TAG)))
    elif case == "garbage":
        files.add_signature(TAG, b"<html>not found</html>")
    async with httpx2.AsyncClient() as client:
        mgr = _manager(tmp_path, client, KEY)
        state = await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "failed"
    expected = {
        "unsigned": "is not signed (no ",
        "wrong key": f"signed by key {OTHER.id_text}, which is not one of release_signing_keys ({KEY.id_text})",
        "tampered": "does not match the index",
        "other tag": f"is signed for tag 'b1', not {TAG}",
        "garbage": "not a minisign signature file",
    }[case]
    assert expected in state.detail, state.detail
    # Refused before any archive was fetched: nothing unverified touched the disk.
    assert not [path for path, _ in files.requests if path.startswith("/files/")]
    assert not (tmp_path / "data" / "engines" / "llama.cpp").exists()


async def test_without_keys_an_unsigned_index_installs_as_before(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    async with httpx2.AsyncClient() as client:
        state = await _manager(tmp_path, client).install(EngineSpec("llama.cpp", TAG, files.release_api()))
    assert state.status == "installed"
    assert state.provenance is not None and state.provenance.signed_by == ""
    assert not (tmp_path / "data" / "engines" / "llama.cpp" / TAG / ".llmgw-index.json.minisig").exists()
