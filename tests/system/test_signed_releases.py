"""An operator-signed engine release index, served by control, installed by a node that requires it.

Control runs as a process serving the real llama-server archive from its files directory; the
operator's index (written once, signed with minisign's format) sits beside the archive. A node
configured with the operator's public key installs from it, and refuses control's generated
(unsigned) index and a signature that does not match.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import trio
from node.signing import OperatorKey
from system.releases import BIN, SHARED_TOKEN, running_control

from llmgw_dev import build_engine


async def _install(config: Path, url: str) -> tuple[int, str]:
    with trio.fail_after(120):
        result = await trio.run_process(
            [
                str(BIN / "llmgw-node"),
                "engines",
                "install",
                "llama.cpp",
                build_engine.RELEASE_TAG,
                "--release-api",
                url,
                "--config",
                str(config),
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return result.returncode, (result.stdout + result.stderr).decode()


async def test_a_node_with_the_operators_key_installs_only_the_index_the_operator_signed(tmp_path: Path) -> None:
    archive = build_engine.ensure_engine()
    tag = build_engine.RELEASE_TAG
    files = tmp_path / "files"
    (files / "engines").mkdir(parents=True)
    shutil.copyfile(archive, files / "engines" / archive.name)
    key = OperatorKey.new()
    config = tmp_path / "node.toml"
    async with running_control(tmp_path, files) as (_admin, agents, _log):
        # A node of the closed fleet: `engines install` fetches from control with its credentials,
        # as the daemon does.
        config.write_text(
            f'data_dir = "{tmp_path / "node"}"\nrelease_signing_keys = ["{key.public}"]\n'
            f'control = ["ws://127.0.0.1:{agents}/agent/v1"]\nnode_id = "n1"\n'
            f'token = "{SHARED_TOKEN}"\n'
        )
        url = f"http://127.0.0.1:{agents}/releases/llama.cpp/{{version}}"
        # Control's generated index is not signed: refused before anything is downloaded.
        code, out = await _install(config, url)
        assert code == 1 and f"release index http://127.0.0.1:{agents}/releases/llama.cpp/{tag} is not signed" in out

        # The operator's index: written once, relative URLs (any control serves it), signed.
        index = files / "engines" / f"llama.cpp-{tag}.json"
        data = archive.read_bytes()
        index.write_text(
            json.dumps(
                {
                    "tag_name": tag,
                    "assets": [
                        {
                            "name": archive.name,
                            "size": len(data),
                            "digest": f"sha256:{hashlib.sha256(data).hexdigest()}",
                            "browser_download_url": f"../../files/engines/{archive.name}",
                        }
                    ],
                }
            )
        )
        signature = index.with_name(index.name + ".minisig")
        signature.write_bytes(OperatorKey.new().sign(index.read_bytes()))
        code, out = await _install(config, url)
        assert code == 1 and "which is not one of release_signing_keys" in out

        signature.write_bytes(key.sign(index.read_bytes()))
        code, out = await _install(config, url)
        assert code == 0, out
        assert f"llama.cpp {tag}: installed {tag}" in out
    manifest = json.loads((tmp_path / "node" / "engines" / "llama.cpp" / tag / ".llmgw-engine.json").read_text())
    provenance = manifest["provenance"]
    assert provenance["signed_by"] == key.id_text
    assert provenance["assets"][0]["url"] == f"http://127.0.0.1:{agents}/files/engines/{archive.name}"
    assert provenance["index_sha256"] == hashlib.sha256(index.read_bytes()).hexdigest()
