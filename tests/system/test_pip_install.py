"""The pip path (issue 28): the wheels an operator builds, installed with plain ``pip`` as the
operator guide says, resolve the newest dependencies our ranges allow, and that install serves.

Nothing of uv.lock is used past building the wheels: control and the node each get a fresh venv
of their own (``python3 -m venv`` + ``pip install dist/…whl``, as docs/operator-guide.md shows),
pip picks whatever PyPI has newest within our ranges, and the daemons are started from those
venvs. A chat then goes through a real llama-server the node installed and proved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import trio
from system.releases import ROOT, uv

from llmgw_dev.build_engine import ensure_engine
from support.fleet import running_fleet

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.system]

# The packages whose versions the log shows: those the ranges leave open and whose changes bit us.
WATCHED = {"httpx2", "httpcore2", "hypercorn", "trio", "trio-websocket", "cattrs", "quart", "huggingface-hub"}


def _pip_venv(where: Path, wheels: list[Path]) -> dict[str, str]:
    """A venv with only ``wheels`` installed by pip (dependencies from the index); its versions."""
    subprocess.run([Path(sys.base_prefix) / "bin" / "python3", "-m", "venv", str(where)], check=True)
    pip = [str(where / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", *map(str, wheels)], check=True, timeout=600)
    listed = subprocess.run([*pip, "list", "--format", "json"], check=True, capture_output=True, text=True)
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed.stdout)}


@pytest.fixture(scope="module")
def pip_venvs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [uv(), "build", "--wheel", "--all-packages", "--out-dir", str(dist), "--quiet"], cwd=ROOT, check=True
    )
    [shared] = dist.glob("llmgw_shared-*.whl")
    [control] = dist.glob("llmgw_control-*.whl")
    [node] = dist.glob("llmgw_node-*.whl")
    venvs = tmp_path_factory.mktemp("venvs")
    for name, wheels in (("control", [shared, control]), ("node", [shared, node])):
        versions = _pip_venv(venvs / name, wheels)
        print(f"pip install of llmgw-{name}:", {k: v for k, v in versions.items() if k in WATCHED})
    return venvs / "control" / "bin", venvs / "node" / "bin"


async def test_wheels_installed_with_plain_pip_serve_a_chat_through_a_real_engine(
    tmp_path: Path, tiny_model: Path, pip_venvs: tuple[Path, Path]
) -> None:
    control_bin, node_bin = pip_venvs
    archive = ensure_engine()
    async with running_fleet(tmp_path, tiny_model, archive, control_bin=control_bin, node_bin=node_bin) as fleet:
        await fleet.add_node("n1")
        client = openai.OpenAI(base_url=fleet.api_url + "/v1", api_key="none", max_retries=0, timeout=120)
        for stream in (False, True, False):
            if stream:
                chunks = await trio.to_thread.run_sync(
                    lambda: list(
                        client.chat.completions.create(
                            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
                        )
                    )
                )
                assert chunks and chunks[-1].choices[0].finish_reason is not None
            else:
                reply = await trio.to_thread.run_sync(
                    lambda: client.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                    )
                )
                assert reply.usage is not None and reply.usage.completion_tokens == 4
        assert "Traceback" not in fleet.control.log()
