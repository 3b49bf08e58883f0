"""What an engine says about itself (llama-server's ``/props`` and ``/v1/models``), read as the
hostile input it is: any answer gives facts, unknown where the answer says nothing usable."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class EngineFacts:
    """What one engine said about itself; None where it said nothing."""

    vision: bool | None = None
    audio: bool | None = None
    tools: bool | None = None
    # The context one request may use (llama-server's per-slot n_ctx).
    context_length: int | None = None
    created: int | None = None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**40 else None


def facts_from(props: Any, models: Any) -> EngineFacts:
    """An engine's facts from its ``/props`` and ``/v1/models`` answers (either may be anything)."""
    props = props if isinstance(props, dict) else {}
    modalities = props.get("modalities")
    modalities = modalities if isinstance(modalities, dict) else {}
    caps = props.get("chat_template_caps")
    caps = caps if isinstance(caps, dict) else {}
    settings = props.get("default_generation_settings")
    context = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
    created = None
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        created = _count(data[0].get("created"))
        meta = data[0].get("meta")
        if context is None and isinstance(meta, dict):
            context = _count(meta.get("n_ctx"))
        # vLLM and SGLang name the context in the model card.
        context = context or _count(data[0].get("max_model_len"))
    tools = _flag(caps.get("supports_tools"))
    if tools is False and _flag(caps.get("supports_tool_calls")):
        tools = True
    return EngineFacts(
        vision=_flag(modalities.get("vision")),
        audio=_flag(modalities.get("audio")),
        tools=tools,
        context_length=context,
        created=created,
    )
