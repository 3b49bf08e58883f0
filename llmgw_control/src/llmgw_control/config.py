"""The control daemon's configuration: a TOML file, overridden by command-line flags.

Every value is checked at start so a typo is refused with its name rather than discovered as a
strange failure under traffic.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
from llmgw_shared.config import ConfigError, load_toml, parse_host_port, strict_converter, structure


@attrs.frozen
class RouterConfig:
    # Per-phase deadlines. The first byte includes the engine's queueing and prompt processing,
    # so it is generous; the idle gap bounds a stream whose engine stopped producing.
    connect_timeout: float = 5.0
    first_byte_timeout: float = 300.0
    idle_timeout: float = 120.0
    # Attempts per request across replicas, counting the first; only before any byte reached
    # the client.
    max_attempts: int = 3
    # How long a replica that failed is avoided while others can serve.
    cooldown: float = 10.0
    max_body_bytes: int = 32 * 1024 * 1024


@attrs.frozen
class EndpointConfig:
    """A static engine replica, for router-only mode."""

    id: str
    url: str
    models: list[str]
    weight: float = 1.0
    # Sent to the engine as a bearer token (llama-server --api-key); never the client's key.
    api_key: str = attrs.field(default="", repr=False)


@attrs.frozen
class ControlConfig:
    listen: str = "127.0.0.1:8080"
    admin_listen: str = "127.0.0.1:8081"
    metrics_listen: str = ""
    # In-flight requests get this long to finish after SIGTERM before they are cut.
    shutdown_grace: float = 30.0
    log_level: str = "info"
    log_format: str = "auto"
    router: RouterConfig = RouterConfig()
    endpoints: list[EndpointConfig] = attrs.Factory(list)


_converter = strict_converter()
_ENDPOINT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
_LOG_LEVELS = ("debug", "info", "warning", "error")


def validate_engine_url(url: str, *, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what}: {url!r} is not an http(s) URL with a host, e.g. http://10.0.0.5:8001")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what}: {url!r} must be a base address without a query or fragment")
    try:
        parts.port  # noqa: B018 -- urlsplit validates the port lazily
    except ValueError:
        raise ConfigError(f"{what}: {url!r} has an invalid port") from None
    return url.rstrip("/")


def _check_positive(value: float, name: str) -> None:
    if not value > 0:
        raise ConfigError(f"{name} must be greater than 0, got {value}")


def validate(config: ControlConfig) -> ControlConfig:
    """Check what types alone cannot; return the config with URLs normalised."""
    for name in ("listen", "admin_listen"):
        parse_host_port(getattr(config, name), what=name)
    if config.metrics_listen:
        parse_host_port(config.metrics_listen, what="metrics_listen")
    if config.log_level not in _LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {', '.join(_LOG_LEVELS)}, got {config.log_level!r}")
    if config.log_format not in ("auto", "json", "text"):
        raise ConfigError(f"log_format must be auto, json or text, got {config.log_format!r}")
    if config.shutdown_grace < 0:
        raise ConfigError(f"shutdown_grace must not be negative, got {config.shutdown_grace}")
    router = config.router
    for field in ("connect_timeout", "first_byte_timeout", "idle_timeout"):
        _check_positive(getattr(router, field), f"router.{field}")
    if router.max_attempts < 1:
        raise ConfigError(f"router.max_attempts must be at least 1, got {router.max_attempts}")
    if router.cooldown < 0:
        raise ConfigError(f"router.cooldown must not be negative, got {router.cooldown}")
    if router.max_body_bytes < 1024:
        raise ConfigError(f"router.max_body_bytes must be at least 1024, got {router.max_body_bytes}")
    seen: set[str] = set()
    endpoints = []
    for index, endpoint in enumerate(config.endpoints):
        where = f"endpoints[{index}]"
        if not _ENDPOINT_ID.match(endpoint.id):
            raise ConfigError(f"{where}.id {endpoint.id!r}: use letters, digits, '.', '_' or '-'")
        if endpoint.id in seen:
            raise ConfigError(f"{where}.id {endpoint.id!r} is used by another endpoint")
        seen.add(endpoint.id)
        if not endpoint.models or any(not m.strip() for m in endpoint.models):
            raise ConfigError(f"{where} ({endpoint.id}): models must name at least one model")
        _check_positive(endpoint.weight, f"{where}.weight")
        url = validate_engine_url(endpoint.url, what=f"{where}.url ({endpoint.id})")
        endpoints.append(attrs.evolve(endpoint, url=url))
    return attrs.evolve(config, endpoints=endpoints)


def parse_endpoint_flag(text: str) -> EndpointConfig:
    """``id=URL=model[,model]`` from the command line."""
    head, sep, models = text.rpartition("=")
    endpoint_id, sep2, url = head.partition("=")
    if not sep or not sep2 or not endpoint_id or not url or not models:
        raise ConfigError(
            f"--endpoint {text!r}: expected id=URL=model[,model], e.g. e1=http://127.0.0.1:8001=tiny"
        )
    names = [m.strip() for m in models.split(",")]
    return EndpointConfig(id=endpoint_id, url=url, models=names)


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> ControlConfig:
    """Read the file (if any), apply command-line overrides, validate."""
    data = load_toml(path) if path else {}
    source = str(path) if path else "configuration"
    config = structure(data, ControlConfig, _converter, source=source)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    extra = overrides.pop("extra_endpoints", None)
    config = attrs.evolve(config, **overrides)
    if extra:
        config = attrs.evolve(config, endpoints=[*config.endpoints, *extra])
    return validate(config)
