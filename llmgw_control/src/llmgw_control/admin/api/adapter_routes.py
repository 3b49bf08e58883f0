"""A profile's LoRA adapters: ``/models/{name}/profiles/{profile}/adapters`` (list, add, remove,
change the default scale).

Each change is a read-modify-write of the model through ``ModelService.replace`` (validated,
stored and applied as any model change, and audited by the API as every write is), so a model
defined in the config file is refused here as there. What a change restarts is the catalog's
rule: llama.cpp replicas restart for a changed list, vLLM replicas load and unload live
(``fleet/live_adapters.py``); a scale change restarts nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

from ...api_errors import bad_request, conflict, not_found
from ...catalog import NAME, SHA256, ModelConfig, ProfileConfig, ProfileKey
from ...catalog.models import MAX_ADAPTER_SCALE, MAX_ADAPTERS, AdapterConfig, WeightsConfig
from ...catalog.service import ModelService
from .context import ApiContext
from .core import Api, Call

# An adapter is a fraction of its base (MiB to a few GiB); 64 GiB is past any LoRA, so a larger
# size is a typo, and the bound keeps a claim from overflowing a node's accounting.
MAX_ADAPTER_BYTES = 64 << 30
MAX_URL = 4096


def _field(doc: str, schema: dict[str, Any], **kwargs: Any) -> Any:
    return attrs.field(metadata={"schema": schema, "doc": doc}, **kwargs)


@attrs.frozen
class AdapterBody:
    name: str = _field(
        "The adapter's model name (letters, digits, '.', '_', '-'; at most 96; no ':')",
        {
            "pattern": NAME.pattern,
            "x-pattern-message": "letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 96 (no ':')",
        },
    )
    url: str = _field(
        "llama.cpp: the GGUF adapter's http(s) URL or absolute path on the nodes; vLLM: the "
        "adapter's directory on the nodes",
        {"minLength": 1, "maxLength": MAX_URL},
    )
    sha256: str = _field(
        "The file's sha256 (vLLM: its adapter_model.safetensors'), 64 lowercase hex digits",
        {"pattern": SHA256.pattern, "x-pattern-message": "must be 64 lowercase hex digits"},
    )
    size: int = _field("The file's size in bytes", {"minimum": 1, "maximum": MAX_ADAPTER_BYTES})
    scale: float = _field(
        "Its strength when applied (1.0: as trained)",
        {"exclusiveMinimum": 0, "maximum": MAX_ADAPTER_SCALE},
        default=1.0,
    )


@attrs.frozen
class ScaleBody:
    scale: float = _field(
        "Its strength when applied (1.0: as trained)", {"exclusiveMinimum": 0, "maximum": MAX_ADAPTER_SCALE}
    )


@attrs.frozen
class AdapterView:
    name: str
    url: str
    sha256: str
    size: int
    scale: float
    loaded_on: list[str] = attrs.field(
        metadata={"doc": "the ready replicas that hold it (requests for it go only to these)"}
    )


@attrs.frozen
class AdapterList:
    model: str
    profile: str
    engine: str
    live: bool = attrs.field(
        metadata={
            "doc": "whether its replicas load and unload adapters without a restart "
            "(vLLM) rather than restarting for a changed list (llama.cpp)"
        }
    )
    adapters: list[AdapterView]


def _check_body(body: AdapterBody, profile: ProfileConfig) -> None:
    """What the schema cannot say: where the weights may be, for this profile's engine."""
    if not math.isfinite(body.scale) or body.scale <= 0:
        raise bad_request("scale", f"must be above 0 and at most {MAX_ADAPTER_SCALE:g}")
    if any(c < " " or c == "\x7f" for c in body.url):
        raise bad_request("url", "must be printable")
    scheme = urlsplit(body.url).scheme.lower()
    local = body.url.startswith("/") or scheme == "file"
    if profile.engine == "vllm" and not body.url.startswith("/"):
        raise bad_request("url", "a vLLM adapter is a directory on the nodes: an absolute path")
    if not local and scheme not in ("http", "https"):
        raise bad_request("url", "must be an http(s) URL or an absolute path on the nodes")
    if ".." in body.url.split("/"):
        raise bad_request("url", "must not have a '..' component")


def _profile_of(service: ModelService, call: Call) -> tuple[ModelConfig, ProfileConfig]:
    model, _source = service.definition(call.path["name"])
    profile = next((p for p in model.profiles if p.name == call.path["profile"]), None)
    if profile is None:
        raise not_found("profile", f"{model.name}:{call.path['profile']}")
    return model, profile


def _view(ctx: ApiContext, model: ModelConfig, profile: ProfileConfig, adapter: AdapterConfig) -> AdapterView:
    profile_key = str(ProfileKey(model.name, profile.name))
    replicas = ctx.fleet.reconciler.replicas.for_model(profile_key) if ctx.fleet is not None else []
    loaded = sorted(r.id for r in replicas if any(name == adapter.name for name, _ in r.adapters))
    w = adapter.weights
    return AdapterView(adapter.name, w.url, w.sha256, w.size, adapter.scale, loaded)


Edit = Callable[[list[AdapterConfig]], list[AdapterConfig]]


def _adding(adapter: AdapterConfig) -> Edit:
    def edit(adapters: list[AdapterConfig]) -> list[AdapterConfig]:
        if any(a.name == adapter.name for a in adapters):
            raise conflict(f"the profile has an adapter named {adapter.name!r}", field="name", code="name_taken")
        if len(adapters) >= MAX_ADAPTERS:
            raise conflict(f"a profile has at most {MAX_ADAPTERS} adapters", code="too_many_adapters")
        return [*adapters, adapter]

    return edit


def _rescaling(name: str, scale: float) -> Edit:
    def edit(adapters: list[AdapterConfig]) -> list[AdapterConfig]:
        if all(a.name != name for a in adapters):
            raise not_found("adapter", name)
        return [attrs.evolve(a, scale=scale) if a.name == name else a for a in adapters]

    return edit


def _removing(name: str) -> Edit:
    def edit(adapters: list[AdapterConfig]) -> list[AdapterConfig]:
        if all(a.name != name for a in adapters):
            raise not_found("adapter", name)
        return [a for a in adapters if a.name != name]

    return edit


def add_adapter_routes(api: Api, ctx: ApiContext) -> None:
    # One read-modify-write at a time on this daemon: two adds racing would each replace the
    # model with only its own adapter added.
    lock = trio.Lock()

    async def change(call: Call, edit: Edit) -> tuple[ModelConfig, ProfileConfig]:
        async with lock:
            model, profile = _profile_of(ctx.the_models(), call)
            new_profile = attrs.evolve(profile, adapters=edit(list(profile.adapters)))
            new = attrs.evolve(model, profiles=[new_profile if p is profile else p for p in model.profiles])
            await ctx.the_models().replace(model.name, new)
            return new, new_profile

    @api.route(
        "GET",
        "/models/{name}/profiles/{profile}/adapters",
        tag="models",
        response=AdapterList,
        summary="A profile's LoRA adapters, and which replicas hold each",
        errors=(404, 503),
    )
    async def list_adapters(call: Call) -> AdapterList:
        model, profile = _profile_of(ctx.the_models(), call)
        return AdapterList(
            model.name,
            profile.name,
            profile.engine,
            profile.engine == "vllm",
            [_view(ctx, model, profile, a) for a in profile.adapters],
        )

    @api.route(
        "POST",
        "/models/{name}/profiles/{profile}/adapters",
        tag="models",
        body=AdapterBody,
        response=AdapterView,
        status=201,
        errors=(404, 409, 503),
        summary="Add a LoRA adapter, served as a model name of its own (vLLM loads it live; "
        "llama.cpp replicas restart)",
    )
    async def add_adapter(call: Call) -> AdapterView:
        body: AdapterBody = call.body
        _check_body(body, _profile_of(ctx.the_models(), call)[1])
        adapter = AdapterConfig(body.name, WeightsConfig(body.url, body.sha256, body.size), body.scale)
        model, profile = await change(call, _adding(adapter))
        return _view(ctx, model, profile, adapter)

    @api.route(
        "PATCH",
        "/models/{name}/profiles/{profile}/adapters/{adapter}",
        tag="models",
        body=ScaleBody,
        response=AdapterView,
        errors=(404, 409, 503),
        summary="Change an adapter's default scale (no replica restarts)",
    )
    async def set_scale(call: Call) -> AdapterView:
        body: ScaleBody = call.body
        if not math.isfinite(body.scale) or body.scale <= 0:
            raise bad_request("scale", f"must be above 0 and at most {MAX_ADAPTER_SCALE:g}")
        name = call.path["adapter"]
        model, profile = await change(call, _rescaling(name, body.scale))
        return _view(ctx, model, profile, next(a for a in profile.adapters if a.name == name))

    @api.route(
        "DELETE",
        "/models/{name}/profiles/{profile}/adapters/{adapter}",
        tag="models",
        status=204,
        errors=(404, 409, 503),
        summary="Remove an adapter (vLLM unloads it live; llama.cpp replicas restart)",
    )
    async def remove_adapter(call: Call) -> None:
        await change(call, _removing(call.path["adapter"]))
