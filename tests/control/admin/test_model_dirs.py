"""Profiles for vLLM and SGLang through the admin API: a model directory instead of one file,
checked at the edge, and each engine's arguments in the replica it gets (issue 19)."""

from __future__ import annotations

from pathlib import Path

from llmgw_control.catalog import EngineConfig

from .conftest import running_control
from .test_api_tenancy import error


async def test_a_vllm_or_sglang_profile_names_a_model_directory(tmp_path: Path) -> None:
    engines = [EngineConfig("vllm", "0.9.1"), EngineConfig("sglang", "0.4.9"), EngineConfig()]
    async with running_control(tmp_path, control_settings={"engines": engines}) as daemon:

        def doc(**profile: object) -> dict[str, object]:
            return {"name": "q", "profiles": [{"name": "gpu", "engine": "vllm", "ram_mib": 100, **profile}]}

        good = await daemon.admin.post("/models", json=doc(model_dir="hub:Qwen/Qwen2.5-0.5B-Instruct@main"))
        assert good.status_code == 201, good.text
        assert good.json()["model"]["profiles"][0]["weights"] is None
        await daemon.admin.delete("/models/q")
        for profile, field in (
            ({}, "profiles[0].model_dir"),
            ({"model_dir": "relative/dir"}, "profiles[0].model_dir"),
            ({"model_dir": "/srv/../etc"}, "profiles[0].model_dir"),
            ({"model_dir": "hub:no-owner"}, "profiles[0].model_dir"),
            ({"model_dir": "/srv/m\n"}, "profiles[0].model_dir"),
            ({"model_dir": "/srv/m", "ram_mib": 0}, "profiles[0].ram_mib"),
            (
                {"model_dir": "/srv/m", "weights": {"url": "/x.gguf", "sha256": "a" * 64, "size": 1}},
                "profiles[0].weights",
            ),
            ({"engine": "llama.cpp", "model_dir": "/srv/m"}, "profiles[0].model_dir"),
            ({"engine": "llama.cpp"}, "profiles[0].weights"),
        ):
            error(await daemon.admin.post("/models", json=doc(**profile)), 400, field)
        # A vLLM replica gets vLLM's arguments: the served name, the context, the batch size.
        good = await daemon.admin.post("/models", json=doc(model_dir="/srv/models/q", slots=32, context=8192))
        resolved = daemon.fleet.catalog.resolve("q")
        assert resolved is not None
        spec = daemon.fleet.reconciler.replica_spec(resolved, "q-x", 20000)
        assert spec.weights is None and spec.model_dir == "/srv/models/q"
        assert spec.args == ["--served-model-name", "q", "--max-model-len", "8192", "--max-num-seqs", "32"]
