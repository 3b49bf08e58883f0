"""LoRA adapters as models of their own (issue 35), against a real llama-server.

The tiny model and two tiny adapters written on the spot (tools/llmgw_dev/tiny_lora.py): one
makes the model answer "XXXX...", the other "QQQQ...". The engine is started with the node's own
command line for adapters (engine_conventions.lora_list), the gateway routes by the catalog
(FleetDirectory) to a replica published as the reconciler publishes it (replica_adapters).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest
import trio
from prometheus_client import CollectorRegistry

from llmgw_control.api_errors import ClientApiError
from llmgw_control.catalog.models import AdapterConfig, Catalog, EngineConfig, ModelConfig, ProfileConfig, WeightsConfig
from llmgw_control.gateway.adapters import replica_adapters
from llmgw_control.gateway.config import GatewayConfig
from llmgw_control.gateway.directory import FleetDirectory
from llmgw_control.gateway.gateway import Gateway
from llmgw_control.gateway.metrics import GatewayMetrics
from llmgw_control.gateway.replicas import Replica, ReplicaSet
from llmgw_control.gateway.upstream import Httpx2Upstream
from llmgw_control.priority import Priority
from llmgw_dev.engine_proc import LlamaServer, running_llama_server
from llmgw_dev.tiny_lora import TOKENS, write_adapters
from llmgw_node.engine_conventions import lora_list

pytestmark = pytest.mark.engine


def _weights(path: Path) -> WeightsConfig:
    data = path.read_bytes()
    return WeightsConfig(str(path), hashlib.sha256(data).hexdigest(), len(data))


@attrs.define
class _Ticket:
    model: str
    book: list[tuple[str, int, int]]
    priority: Priority = Priority.INTERACTIVE

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.book.append((self.model, prompt_tokens, completion_tokens))

    def give_back(self) -> None:
        self.book.append((self.model, 0, 0))


@attrs.define
class _Admission:
    """An allow-list and a quota per model name, recording what each request was counted under."""

    allowed: frozenset[str]
    refused: frozenset[str] = frozenset()
    admitted: list[str] = attrs.Factory(list)
    book: list[tuple[str, int, int]] = attrs.Factory(list)

    def authenticate(self, authorization: str | None) -> frozenset[str] | None:
        return self.allowed

    def admit(self, authorization: str | None, model: str, *, estimated_tokens: int) -> _Ticket:
        if model not in self.allowed:
            raise ClientApiError(404, f"The model '{model}' does not exist.", code="model_not_found")
        if model in self.refused:
            raise ClientApiError(429, f"quota of {model} used up", code="quota_exceeded")
        self.admitted.append(model)
        return _Ticket(model, self.book)


@pytest.fixture
async def setup(
    llama_server_binary: Path, tiny_model: Path, tmp_path: Path
) -> AsyncIterator[tuple[LlamaServer, Catalog, dict[str, Path]]]:
    files = write_adapters(tmp_path)
    catalog = Catalog(
        [
            ModelConfig(
                "tiny",
                [
                    ProfileConfig(
                        name="cpu",
                        weights=_weights(tiny_model),
                        adapters=[AdapterConfig(name, _weights(path)) for name, path in files.items()],
                    )
                ],
            )
        ],
        [EngineConfig(name="llama.cpp", version="b11312")],
    )
    async with running_llama_server(
        llama_server_binary, tiny_model, alias="tiny", extra_args=["--lora-scaled", lora_list(list(files.values()))]
    ) as server:
        yield server, catalog, files


def _gateway(server: LlamaServer, catalog: Catalog, admission: _Admission | None = None) -> Gateway:
    replicas = ReplicaSet()
    resolved = catalog.resolve("tiny")
    assert resolved is not None
    adapters, mode = replica_adapters(resolved.profile, [a.name for a in resolved.profile.adapters])
    replicas.publish(
        Replica(
            id="r1",
            url=server.url,
            models=frozenset({resolved.profile_key}),
            slots=4,
            adapters=adapters,
            adapter_mode=mode,
        )
    )
    return Gateway(
        replicas,
        Httpx2Upstream(),
        GatewayMetrics(CollectorRegistry()),
        GatewayConfig(),
        directory=FleetDirectory(catalog, replicas),
        admission=admission,
    )


async def _ask(client: httpx2.AsyncClient, model: str, **extra: Any) -> httpx2.Response:
    with trio.fail_after(60):
        return await client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "Say something"}], "max_tokens": 8, **extra},
        )


def _text(answer: httpx2.Response) -> str:
    assert answer.status_code == 200, answer.text
    content: str = answer.json()["choices"][0]["message"]["content"]
    return content


def _marked(text: str) -> str | None:
    """The adapter whose token makes up the answer, None for an answer of the base model."""
    for name, char in TOKENS.items():
        if text.count(char) >= 6:
            return name
    return None


async def test_each_adapter_answers_with_its_effect_and_the_base_without(
    setup: tuple[LlamaServer, Catalog, dict[str, Path]],
) -> None:
    server, catalog, _ = setup
    gateway = _gateway(server, catalog)
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=gateway),  # type: ignore[arg-type]
        base_url="http://gw",
    ) as client:
        listed = {c["id"] for c in (await client.get("/v1/models")).json()["data"]}
        assert {"tiny", "tiny:cpu", "tiny-lora-x", "tiny-lora-q"} <= listed
        assert _marked(_text(await _ask(client, "tiny-lora-x"))) == "tiny-lora-x"
        assert _marked(_text(await _ask(client, "tiny-lora-q"))) == "tiny-lora-q"
        assert _marked(_text(await _ask(client, "tiny"))) is None
        # The client's own lora field is overridden: the base stays the base, an adapter its own.
        hostile = [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 1.0}]
        assert _marked(_text(await _ask(client, "tiny", lora=hostile))) is None
        assert _marked(_text(await _ask(client, "tiny-lora-q", lora=hostile))) == "tiny-lora-q"
        # Both adapters' requests at once, on one replica (four slots): each gets its own.
        answers: dict[int, str] = {}

        async def one(index: int, model: str) -> None:
            answers[index] = _text(await _ask(client, model))

        models = ["tiny-lora-x", "tiny-lora-q", "tiny", "tiny-lora-q", "tiny-lora-x", "tiny"]
        async with trio.open_nursery() as nursery:
            for index, model in enumerate(models):
                nursery.start_soon(one, index, model)
        for index, model in enumerate(models):
            assert _marked(answers[index]) == (None if model == "tiny" else model), (model, answers[index])
    # Metrics count each adapter under its own name.
    registry = gateway.metrics
    for model, n in (("tiny-lora-x", 3), ("tiny-lora-q", 4)):
        assert registry.requests.labels(model, "r1", "200")._value.get() == n  # type: ignore[attr-defined]


async def test_usage_allow_lists_and_quotas_count_each_adapter_model(
    setup: tuple[LlamaServer, Catalog, dict[str, Path]],
) -> None:
    server, catalog, _ = setup
    admission = _Admission(
        allowed=frozenset({"tiny", "tiny-lora-x", "tiny-lora-q"}), refused=frozenset({"tiny-lora-q"})
    )
    gateway = _gateway(server, catalog, admission)
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=gateway),  # type: ignore[arg-type]
        base_url="http://gw",
    ) as client:
        assert _marked(_text(await _ask(client, "tiny-lora-x"))) == "tiny-lora-x"
        assert (await _ask(client, "tiny-lora-q")).status_code == 429
        _text(await _ask(client, "tiny"))
        assert admission.admitted == ["tiny-lora-x", "tiny"]
        assert [(m, c) for m, _, c in admission.book] == [("tiny-lora-x", 8), ("tiny", 8)]
        # A key whose allow-list names the base only neither sees nor calls its adapters.
        admission.allowed = frozenset({"tiny"})
        listed = {c["id"] for c in (await client.get("/v1/models")).json()["data"]}
        assert "tiny" in listed and "tiny-lora-x" not in listed
        assert (await _ask(client, "tiny-lora-x")).status_code == 404
