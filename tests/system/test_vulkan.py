"""A GPU backend for real: llama-server's Vulkan build on Mesa's lavapipe (a Vulkan device on the CPU).

The node's only GPU is lavapipe, counted through the test-only switch LLMGW_TEST_SOFTWARE_GPUS=1.
Control serves both builds (CPU and Vulkan, built from the same PyPI sources and cached); the node
must choose the Vulkan one, prove it with ``--list-devices``, place a replica with every layer
offloaded, and answer through the gateway. With the Vulkan loader gone (LLMGW_TEST_VULKAN_LOADER
names a missing one) the same node falls back to the CPU build, degraded, and the GPU profile is
not placed there while a ``cpu_ok`` one is.

Needs mesa-vulkan-drivers, libvulkan1, and the Vulkan build (tools/llmgw_dev/build_engine.py
--backend vulkan, which needs glslc and Vulkan headers; see its notes): skipped, saying which, without.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trio

from llmgw_dev import build_engine
from llmgw_dev.served_files import place
from support.fleet import Fleet, node_ready, running_fleet

# The first run may build the Vulkan engine: room for it, as for the CPU build.
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(3600)]
LAVAPIPE = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")


@pytest.fixture(scope="session")
def engine_archive(llama_server_binary: Path) -> Path:
    return build_engine.ensure_engine()


@pytest.fixture(scope="session")
def vulkan_archive() -> Path:
    if not LAVAPIPE.exists():
        pytest.skip("needs Mesa's lavapipe (apt-get install mesa-vulkan-drivers libvulkan1)")
    if not build_engine.is_built("vulkan"):
        # Built for this tier only (about 25 minutes on 2 busy cores, then cached), where what the
        # build needs is there; otherwise skipped, saying what is missing.
        if shutil.which("glslc") is None:
            pytest.skip("the Vulkan build needs glslc (apt-get install glslc libvulkan-dev spirv-headers)")
        try:
            build_engine.vulkan_flags()
        except SystemExit as exc:
            pytest.skip(str(exc))
    return build_engine.ensure_engine("vulkan")


def chat(fleet: Fleet, model: str) -> Any:
    client = openai.OpenAI(base_url=fleet.api_url + "/v1", api_key="none", max_retries=0, timeout=300)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)


def node_of(nodes: list[dict[str, Any]], node_id: str) -> dict[str, Any]:
    return next(n for n in nodes if n["id"] == node_id)


async def test_a_node_whose_only_gpu_is_lavapipe_serves_fully_offloaded_through_the_vulkan_build(
    tmp_path: Path, tiny_model: Path, engine_archive: Path, vulkan_archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_TEST_SOFTWARE_GPUS", "1")
    monkeypatch.delenv("LLMGW_TEST_VULKAN_LOADER", raising=False)
    profile = {"vram_mib": 64, "start_timeout": 600.0}
    async with running_fleet(tmp_path, tiny_model, engine_archive, models=[("tiny", profile)]) as fleet:
        place(vulkan_archive, tmp_path / "files" / "engines" / vulkan_archive.name)
        await fleet.add_node("n1")
        nodes, _ = await fleet.state()
        node = node_of(nodes, "n1")
        assert node["facts"]["gpu_backend"] == "vulkan" and node["facts"]["degraded"] == ""
        assert "llvmpipe" in node["facts"]["gpus"][0]["name"]
        (engine,) = node["engines"]
        assert engine["provenance"]["backend"] == "vulkan"
        assert [a["name"] for a in engine["provenance"]["assets"]] == [vulkan_archive.name]

        answer = await trio.to_thread.run_sync(chat, fleet, "tiny")
        assert answer.usage.completion_tokens == 4

        _, models = await fleet.state()
        (replica,) = next(m for m in models if m["model"] == "tiny")["replicas"]
        async with httpx2.AsyncClient(base_url=fleet.admin_url + "/api/v1", timeout=30) as admin:
            logs = (await admin.get(f"/replicas/{replica['id']}/logs", params={"lines": "1000"})).json()["lines"]
        offloaded = [line for line in logs if "layers to GPU" in line and "offloaded" in line]
        assert offloaded and offloaded[-1].endswith("offloaded 3/3 layers to GPU"), offloaded
        assert any("Vulkan0" in line for line in logs)


async def test_without_the_vulkan_loader_the_node_runs_the_cpu_build_degraded(
    tmp_path: Path, tiny_model: Path, engine_archive: Path, vulkan_archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_TEST_SOFTWARE_GPUS", "1")
    monkeypatch.setenv("LLMGW_TEST_VULKAN_LOADER", "libvulkan-removed.so.1")
    models = [
        ("tiny", {"vram_mib": 64, "min_replicas": 1}),
        ("tiny-cpu-ok", {"vram_mib": 64, "min_replicas": 1, "cpu_ok": True}),
    ]
    async with running_fleet(tmp_path, tiny_model, engine_archive, models=models) as fleet:
        place(vulkan_archive, tmp_path / "files" / "engines" / vulkan_archive.name)
        await fleet.add_node("n1")
        nodes, _ = await fleet.wait_for(
            lambda nodes, models: node_ready("n1")(nodes, models) and node_of(nodes, "n1")["facts"]["degraded"] != ""
        )
        node = node_of(nodes, "n1")
        assert "GPU it cannot reach" in node["facts"]["degraded"]
        assert "libvulkan-removed.so.1" in node["facts"]["degraded"]
        (engine,) = node["engines"]
        assert engine["provenance"]["backend"] == "cpu"

        answer = await trio.to_thread.run_sync(chat, fleet, "tiny-cpu-ok")
        assert answer.usage.completion_tokens == 4
        _, models_now = await fleet.wait_for(
            lambda nodes, models: "degraded, CPU only" in next(m for m in models if m["model"] == "tiny")["status"]
        )
        tiny = next(m for m in models_now if m["model"] == "tiny")
        assert tiny["replicas"] == [] and "does not say cpu_ok" in tiny["status"]


def test_the_gpu_check_runs_end_to_end_on_lavapipe(
    vulkan_archive: Path, engine_archive: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `dev.py gpu-check` is for NVIDIA GPUs; --backend vulkan runs the same code here, so the
    # check is known to work before a GPU machine is at hand.
    from llmgw_dev import gpu_check

    monkeypatch.setenv("LLMGW_TEST_SOFTWARE_GPUS", "1")
    for name in ("LLMGW_TEST_VULKAN_LOADER", "LLMGW_TINY_MODEL", "LLMGW_LLAMA_SOURCES"):
        monkeypatch.delenv(name, raising=False)
    assert gpu_check.main(["--backend", "vulkan", "--tokens", "16", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "offload (load log)      offloaded 3/3 layers to GPU" in out
    assert "vulkan build, proven with --list-devices" in out
    for row in ("GPU, through the gateway", "GPU, engine directly", "CPU, engine directly (--device none)"):
        assert f"| {row}" in out
