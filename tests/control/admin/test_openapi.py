"""The OpenAPI document against the live server: schemathesis generates valid and invalid input
for every operation; no answer may be a 500, and every answer must match the document (status
documented, JSON where JSON is promised, body as the schema says)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode, openapi
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from llmgw_control.mirror.config import HubConfig
from llmgw_dev.fake_hub import FakeHub, FakeRepo, run_fake_hub

from .conftest import Daemon, fake_node, model_doc, running_control

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 15


def fuzz(document: dict[str, Any], base_url: str) -> list[str]:
    """Run every operation in both generation modes; the failures, one line each."""
    schema = openapi.from_dict(document)
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        definition = operation.definition.raw
        # Invalid input can only be made where there is a body or a typed query; a path's
        # string segment has no invalid value (hypothesis would report it unsatisfiable).
        invalid = "requestBody" in definition or any(p["in"] == "query" for p in definition.get("parameters", []))
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if invalid else (GenerationMode.POSITIVE,)
        for mode in modes:

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case: Any) -> None:
                response = case.call(base_url=base_url)
                case.validate_response(response, checks=CHECKS)

            try:
                check()
            except Exception as exc:  # every operation's failure is collected, then reported
                failures.append(f"{operation.label} ({mode.value}): {str(exc).splitlines()[:6]}")
    return failures


@pytest.fixture
async def daemon(tmp_path: Path, tiny_gguf: bytes) -> AsyncIterator[Daemon]:
    """A daemon whose model mirror talks to a fake Hub (no test reaches the internet), with a files
    directory so the pull routes run too."""
    repos = {"acme/tiny-GGUF": FakeRepo(files={"tiny.Q8_0.gguf": tiny_gguf})}
    async with (
        run_fake_hub(FakeHub(repos=repos)) as hub,
        running_control(
            tmp_path,
            files_dir=str(tmp_path / "files"),
            control_settings={"hub": HubConfig(endpoint=hub.url, allow_networks=["127.0.0.0/8"])},
        ) as d,
    ):
        yield d


@pytest.mark.slow  # left out of the quick tier: every route of a running daemon, checked against the document
async def test_the_document_matches_the_server(daemon: Daemon) -> None:
    document = (await daemon.admin.get("/openapi.json")).json()
    assert document["openapi"].startswith("3.1")
    paths = document["paths"]
    # The contract's routes are all there (POST /nodes belongs to onboarding and is not ours).
    for path, method in [
        ("/api/v1/nodes", "get"),
        ("/api/v1/nodes/{node_id}/drain", "post"),
        ("/api/v1/models", "post"),
        ("/api/v1/models/{name}", "put"),
        ("/api/v1/models/{name}", "delete"),
        ("/api/v1/replicas", "get"),
        ("/api/v1/engines", "get"),
        ("/api/v1/groups/{group_id}", "patch"),
        ("/api/v1/keys/{key_id}/revoke", "post"),
        ("/api/v1/groups/{group_id}/quota", "put"),
        ("/api/v1/usage", "get"),
        ("/api/v1/capacity", "get"),
    ]:
        assert method in paths.get(path, {}), (path, method)

    # Something to find: a node, a model with a replica, a group with a key and a quota.
    await daemon.admin.post("/models", json=model_doc(min_replicas=1))
    group = (await daemon.admin.post("/groups", json={"name": "org"})).json()["group"]["id"]
    await daemon.admin.post("/keys", json={"name": "k", "group_id": group})
    await daemon.admin.put(f"/groups/{group}/quota", json={"tokens_per_minute": 10})
    async with fake_node(daemon, "n1"):
        failures = await trio.to_thread.run_sync(fuzz, document, daemon.admin_url)
    assert failures == [], "\n".join(failures)
