"""Engine provenance: every install records where it came from, who asked, and can be checked again.

The real llama-server archive from a GitHub-shaped index on 127.0.0.1, installed through the
daemon's own command path (``NodeService.handle(SetEngines)``) and the ``llmgw-node`` command.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import httpx2
import pytest
import trio
from node.conftest import TAG
from node.helpers import next_engine_state
from node.release_server import FileServer
from node.signing import OperatorKey

from llmgw_node.config import NodeConfig
from llmgw_node.engines.manager import EngineManager
from llmgw_node.engines.release import Platform
from llmgw_node.service import open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import (
    AssetProvenance,
    EngineSpec,
    EngineStateReport,
    SetEngines,
    converter,
    decode,
    encode,
)

# Left out of the quick tier (slow: installs and re-checks real engine archives).
pytestmark = pytest.mark.slow


NODE = [sys.executable, "-m", "llmgw_node"]


async def test_an_install_records_its_source_digests_time_and_the_epoch_that_asked(
    tmp_path: Path,
    node_config: NodeConfig,
    fast_timing: Timing,
    files: FileServer,
    engine_archive: tuple[str, bytes],
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    before = time.time()
    async with open_node_service(node_config, timing=fast_timing) as svc:
        ack = await svc.handle(
            SetEngines(id="1", fencing_token=7, engines=[EngineSpec("llama.cpp", TAG, files.release_api())])
        )
        assert ack.ok
        state = await next_engine_state(svc, lambda s: s.status in ("installed", "failed"))
        hello = svc.hello()
    assert state.status == "installed", state.describe()
    p = state.provenance
    assert p is not None
    assert p.source == files.release_api().replace("{version}", TAG)
    assert p.index_sha256 == hashlib.sha256(files.index_bytes(TAG)).hexdigest()
    assert p.assets == [
        AssetProvenance(name, f"{files.base}/files/{name}", hashlib.sha256(data).hexdigest(), len(data))
    ]
    assert before <= p.installed_at <= time.time()
    assert p.control_epoch == 7 and p.signed_by == "" and not p.archives_kept
    # Control hears it in the hello and the state reports, through the real wire format.
    assert decode(encode(hello)).engines == [state]  # type: ignore[union-attr]
    # The manifest on disk says the same, and a restarted node reads it back.
    manifest = json.loads((node_config.data_path / "engines" / "llama.cpp" / TAG / ".llmgw-engine.json").read_text())
    assert converter.structure(manifest["provenance"], type(p)) == p
    async with httpx2.AsyncClient() as client:
        again = EngineManager(node_config.data_path, client, Platform("linux", "x86_64", False))
        await again.load(prove=False)
    assert again.state("llama.cpp", TAG).provenance == p


async def test_a_manifest_from_before_provenance_still_loads_with_what_it_recorded(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(tmp_path, client, Platform("linux", "x86_64", False))
        await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
        marker = tmp_path / "engines" / "llama.cpp" / TAG / ".llmgw-engine.json"
        info = json.loads(marker.read_text())
        del info["provenance"]
        marker.write_text(json.dumps(info))
        again = EngineManager(tmp_path, client, Platform("linux", "x86_64", False))
        await again.load()
    state = again.state("llama.cpp", TAG)
    assert state.status == "installed" and state.provenance is not None
    assert [a.sha256 for a in state.provenance.assets] == [hashlib.sha256(data).hexdigest()]
    assert state.provenance.installed_at == info["installed_at"]


async def test_a_manifest_provenance_control_would_refuse_is_not_reported(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    # The node reads its manifests back from disk; a report naming "../x" would be refused by
    # control's decode (and the engine's state with it), so the node drops the provenance instead.
    name, data = engine_archive
    files.publish(TAG, {name: data})
    async with httpx2.AsyncClient() as client:
        mgr = EngineManager(tmp_path, client, Platform("linux", "x86_64", False))
        await mgr.install(EngineSpec("llama.cpp", TAG, files.release_api()))
        marker = tmp_path / "engines" / "llama.cpp" / TAG / ".llmgw-engine.json"
        info = json.loads(marker.read_text())
        info["provenance"]["assets"][0]["name"] = "../../etc/passwd"
        marker.write_text(json.dumps(info))
        again = EngineManager(tmp_path, client, Platform("linux", "x86_64", False))
        await again.load()
    state = again.state("llama.cpp", TAG)
    assert state.status == "installed" and state.provenance is None
    assert decode(encode(EngineStateReport(engine=state))) == EngineStateReport(engine=state)


async def _cli(*args: str) -> tuple[int, str]:
    with trio.fail_after(120):
        result = await trio.run_process([*NODE, *args], capture_stdout=True, capture_stderr=True, check=False)
    return result.returncode, (result.stdout + result.stderr).decode()


async def test_engines_check_hashes_kept_archives_against_the_signed_index_again(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    key = OperatorKey.new()
    files.publish(TAG, {name: data})
    files.add_signature(TAG, key.sign(files.index_bytes(TAG)))
    config = tmp_path / "node.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\nkeep_engine_archives = true\nrelease_signing_keys = ["{key.public}"]\n'
    )
    code, out = await _cli(
        "engines", "install", "llama.cpp", TAG, "--release-api", files.release_api(), "--config", str(config)
    )
    assert code == 0, out
    folder = tmp_path / "data" / "engines" / "llama.cpp" / TAG
    kept = folder / ".llmgw-archives" / name
    assert kept.read_bytes() == data
    code, out = await _cli("engines", "check", "--config", str(config))
    assert code == 0, out
    # The provenance, for people: the source, who signed, the digest, when, by hand.
    assert (
        f"from {files.base}/repos/ggml-org/llama.cpp/releases/tags/{TAG} (signed by {key.id_text}): "
        f"{name} sha256:{hashlib.sha256(data).hexdigest()[:16]}" in out
    )
    assert "by hand; archives kept" in out

    original = kept.read_bytes()
    kept.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    code, out = await _cli("engines", "check", "--config", str(config))
    assert code == 1
    assert f"failed: re-check: the kept archive {name} has sha256 " in out
    assert f"not the {hashlib.sha256(data).hexdigest()} its release index publishes" in out

    # Rewriting the kept index to match a changed archive does not help: it is hashed and signed.
    kept.write_bytes(original)
    index = json.loads((folder / ".llmgw-index.json").read_text())
    index["assets"][0]["digest"] = "sha256:" + "0" * 64
    (folder / ".llmgw-index.json").write_text(json.dumps(index))
    code, out = await _cli("engines", "check", "--config", str(config))
    assert code == 1 and "the kept release index no longer matches the sha256 recorded at install" in out

    (folder / ".llmgw-index.json").write_bytes(files.index_bytes(TAG))
    assert (await _cli("engines", "check", "--config", str(config)))[0] == 0
    kept.unlink()
    code, out = await _cli("engines", "check", "--config", str(config))
    assert code == 1 and f"the kept archive {name} is gone" in out


async def test_without_keep_engine_archives_nothing_is_kept_and_check_proves_as_before(
    tmp_path: Path, files: FileServer, engine_archive: tuple[str, bytes]
) -> None:
    name, data = engine_archive
    files.publish(TAG, {name: data})
    async with httpx2.AsyncClient() as client:
        state = await EngineManager(tmp_path, client, Platform("linux", "x86_64", False)).install(
            EngineSpec("llama.cpp", TAG, files.release_api())
        )
    assert state.provenance is not None and not state.provenance.archives_kept
    assert not (tmp_path / "engines" / "llama.cpp" / TAG / ".llmgw-archives").exists()
    assert [a.name for a in state.provenance.assets] == [name]
