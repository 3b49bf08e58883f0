"""The control daemon's configuration: a TOML file, overridden by command-line flags.

Every value is checked at start so a typo is refused with its name rather than discovered as a
strange failure under traffic.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from llmgw_shared.config import ConfigError, load_toml, parse_host_port, strict_converter, structure
from llmgw_shared.config_doc import doc
from llmgw_shared.names import BadName, check_engine_name, check_version
from llmgw_shared.tracing import TracingConfig, validate_tracing

from .admin.org_config import AuditConfig, OidcConfig, validate_audit, validate_oidc
from .catalog import ROUTING_POLICIES, EngineConfig, ModelConfig, validate_models
from .fleet.agents import AgentsConfig
from .fleet.leadership import LeadershipConfig
from .fleet.replica_records import ReconcilerConfig
from .gateway.activator import ActivatorConfig
from .gateway.config import GatewayConfig, StaticReplicaConfig
from .gateway.cors import origin_problem
from .mirror.config import HubConfig, validate_hub
from .transport.config import ClientTlsConfig, ListenersConfig


@attrs.frozen
class MonitoringConfig:
    # The Prometheus that scrapes this daemon (http://host:9090), for the dashboard's charts over
    # time; the dashboard proxies its query_range API so browsers talk only to llmgw. Empty: no
    # history, and the dashboard says how to enable it.
    prometheus: str = ""


@attrs.frozen
class ControlConfig:
    listen: str = "127.0.0.1:8080"
    admin_listen: str = "127.0.0.1:8081"
    # Names the admin listener answers to besides IP addresses and localhost (DNS rebinding guard).
    admin_hosts: list[str] = attrs.Factory(list)
    # Require an admin key (Authorization: Bearer) on every admin-listener request but /healthz.
    # Always required when admin_listen is not a loopback address, since the admin API can make
    # keys and onboard nodes; set it to require keys on loopback too (a machine shared with others).
    admin_require_key: bool = False
    metrics_listen: str = ""
    # In-flight requests get this long to finish after SIGTERM before they are cut.
    shutdown_grace: float = 30.0
    # Gateway processes on this machine sharing the client port (SO_REUSEPORT); 1: this process
    # serves alone, as before workers existed (docs/operator-guide.md, "Workers").
    workers: int = 1
    log_level: str = "info"
    log_format: str = "auto"
    # Where control keeps its own state: secrets, and the embedded SQLite store.
    data_dir: str = ""
    # The store: a SQLite file path, or postgresql://... when several control daemons share it.
    # Empty: <data_dir>/llmgw.db.
    store: str = ""
    router: GatewayConfig = attrs.Factory(GatewayConfig)
    endpoints: list[StaticReplicaConfig] = attrs.Factory(list)
    agents: AgentsConfig = attrs.Factory(AgentsConfig)
    reconciler: ReconcilerConfig = attrs.Factory(ReconcilerConfig)
    activator: ActivatorConfig = attrs.Factory(ActivatorConfig)
    leadership: LeadershipConfig = attrs.Factory(LeadershipConfig)
    # Every node gets these engines; the default is the llama.cpp build this release is tested with.
    engines: list[EngineConfig] = attrs.Factory(lambda: [EngineConfig()])
    models: list[ModelConfig] = attrs.Factory(list)
    monitoring: MonitoringConfig = attrs.Factory(MonitoringConfig)
    listeners: ListenersConfig = attrs.field(
        factory=ListenersConfig,
        metadata=doc("Limits and deadlines every listener applies to each connection (docs/security.md)."),
    )
    client_tls: ClientTlsConfig = attrs.field(
        factory=ClientTlsConfig,
        metadata=doc("TLS on the client listener, or the TLS proxies in front of it (docs/security.md)."),
    )
    hub: HubConfig = attrs.field(
        factory=HubConfig,
        metadata=doc("The model mirror: the Hugging Face Hub it searches and pulls from (docs/model-mirror.md)."),
    )
    audit: AuditConfig = attrs.field(
        factory=AuditConfig, metadata=doc("The audit log of admin changes and refusals (docs/security.md).")
    )
    oidc: OidcConfig = attrs.field(
        factory=OidcConfig,
        metadata=doc("Single sign-on for the dashboard with an OpenID Connect provider (docs/security.md)."),
    )
    tracing: TracingConfig = attrs.field(
        factory=TracingConfig,
        metadata=doc(
            "OpenTelemetry traces of client requests and fleet work, sent to an OTLP collector "
            '(docs/operator-guide.md, "Traces").'
        ),
    )


# More gateway processes than a large machine has cores only adds context switches and database
# connections; the bound also keeps a typo (1000) from forking a thousand daemons.
MAX_WORKERS = 64

_converter = strict_converter()
_ENDPOINT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
_LOG_LEVELS = ("debug", "info", "warning", "error")
# An endpoint's engine_slots is a loop bound on the request path (gateway/engine_slots.py walks
# them): llama-server's -np is a few dozen at most in practice; 4096 stops a typo, not a setup.
_MAX_ENGINE_SLOTS = 4096
_HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9\-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9\-]{0,62}))*\.?$")


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
    for name in config.admin_hosts:
        if not _HOST_NAME.fullmatch(name):
            raise ConfigError(
                f"admin_hosts: {name!r} is not a host name (no scheme, port or path), e.g. control.mgmt.example"
            )
    if config.log_level not in _LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {', '.join(_LOG_LEVELS)}, got {config.log_level!r}")
    if config.log_format not in ("auto", "json", "text"):
        raise ConfigError(f"log_format must be auto, json or text, got {config.log_format!r}")
    if config.shutdown_grace < 0:
        raise ConfigError(f"shutdown_grace must not be negative, got {config.shutdown_grace}")
    if not 1 <= config.workers <= MAX_WORKERS:
        raise ConfigError(f"workers must be between 1 and {MAX_WORKERS}, got {config.workers}")
    router = config.router
    for field in (
        "connect_timeout",
        "first_byte_timeout",
        "idle_timeout",
        "hang_suspect_after",
        "hang_probe_timeout",
        "hang_check_every",
        "hung_probe_every",
    ):
        _check_positive(getattr(router, field), f"router.{field}")
    if router.max_attempts < 1:
        raise ConfigError(f"router.max_attempts must be at least 1, got {router.max_attempts}")
    if router.cooldown < 0:
        raise ConfigError(f"router.cooldown must not be negative, got {router.cooldown}")
    if router.max_continuations < 0:
        raise ConfigError(f"router.max_continuations must not be negative (0: never), got {router.max_continuations}")
    for name in router.continue_streams:
        if not name.strip() or len(name) > 128:
            raise ConfigError(f"router.continue_streams: {name[:40]!r} is not a model name (model or model:profile)")
    if router.max_body_bytes < 1024:
        raise ConfigError(f"router.max_body_bytes must be at least 1024, got {router.max_body_bytes}")
    if router.routing not in ROUTING_POLICIES:
        raise ConfigError(f"router.routing must be one of {', '.join(ROUTING_POLICIES)}, got {router.routing!r}")
    # Above 10 the bound no longer bounds anything a fleet of replicas would notice.
    for origin in router.allowed_origins:
        if problem := origin_problem(origin):
            raise ConfigError(f"router.allowed_origins: {origin!r} {problem}")
    if not 0 <= router.affinity_load_factor <= 10:
        raise ConfigError(f"router.affinity_load_factor must be between 0 and 10, got {router.affinity_load_factor}")
    _validate_fleet(config)
    _validate_listeners(config)
    if config.monitoring.prometheus:
        url = validate_engine_url(config.monitoring.prometheus, what="monitoring.prometheus")
        config = attrs.evolve(config, monitoring=MonitoringConfig(prometheus=url))
    config = attrs.evolve(
        config,
        hub=validate_hub(config.hub),
        audit=validate_audit(config.audit),
        oidc=validate_oidc(config.oidc),
        tracing=validate_tracing(config.tracing),
    )
    seen: set[str] = set()
    endpoints = []
    for index, endpoint in enumerate(config.endpoints):
        where = f"endpoints[{index}]"
        if not _ENDPOINT_ID.fullmatch(endpoint.id):
            raise ConfigError(f"{where}.id {endpoint.id!r}: use letters, digits, '.', '_' or '-'")
        if endpoint.id in seen:
            raise ConfigError(f"{where}.id {endpoint.id!r} is used by another endpoint")
        seen.add(endpoint.id)
        if not endpoint.models or any(not m.strip() for m in endpoint.models):
            raise ConfigError(f"{where} ({endpoint.id}): models must name at least one model")
        _check_positive(endpoint.weight, f"{where}.weight")
        if endpoint.slots < 1:
            raise ConfigError(f"{where}.slots ({endpoint.id}) must be at least 1, got {endpoint.slots}")
        if not 0 <= endpoint.engine_slots <= _MAX_ENGINE_SLOTS:
            raise ConfigError(
                f"{where}.engine_slots ({endpoint.id}) must be 0 (the engine chooses) to "
                f"{_MAX_ENGINE_SLOTS}, got {endpoint.engine_slots}"
            )
        url = validate_engine_url(endpoint.url, what=f"{where}.url ({endpoint.id})")
        endpoints.append(attrs.evolve(endpoint, url=url))
    return attrs.evolve(config, endpoints=endpoints)


def _validate_fleet(config: ControlConfig) -> None:
    agents = config.agents
    if agents.listen:
        parse_host_port(agents.listen, what="agents.listen")
    if agents.public_url:
        validate_engine_url(agents.public_url, what="agents.public_url")
    for digest in agents.join_token_digests:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise ConfigError(
                f"agents.join_token_digests: {digest[:12]!r}... is not sha256:<64 hex digits> "
                "(`llmgw-control join-token` makes a token and prints its digest)"
            )
    if not 0 < agents.heartbeat_interval < agents.unreachable_after < agents.lost_after:
        raise ConfigError("agents: need 0 < heartbeat_interval < unreachable_after < lost_after")
    if bool(agents.tls_cert_file) != bool(agents.tls_key_file):
        raise ConfigError("agents: tls_cert_file and tls_key_file go together")
    if agents.tls_client_ca_file and not agents.tls_cert_file:
        raise ConfigError("agents: tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
    if agents.max_frame_bytes < 4096:
        raise ConfigError("agents.max_frame_bytes must be at least 4096")
    rec = config.reconciler
    if not 1 <= rec.port_min <= rec.port_max <= 65535:
        raise ConfigError("reconciler: need 1 <= port_min <= port_max <= 65535")
    if rec.saturated_after < 0:
        raise ConfigError(f"reconciler.saturated_after must not be negative, got {rec.saturated_after}")
    if rec.interval <= 0 or rec.backoff_base <= 0 or rec.backoff_cap < rec.backoff_base:
        raise ConfigError("reconciler: interval and backoff_base must be positive, backoff_cap >= backoff_base")
    if rec.reschedule_burst < 1 or rec.reschedules_per_minute <= 0:
        raise ConfigError("reconciler: reschedule_burst must be at least 1 and reschedules_per_minute positive")
    if rec.assigned_timeout <= 0 or agents.ack_timeout <= 0:
        raise ConfigError("reconciler.assigned_timeout and agents.ack_timeout must be positive")
    if rec.evict_min_age < 0 or rec.yield_after < 0 or rec.weights_keep_for < 0:
        raise ConfigError("reconciler.evict_min_age, yield_after and weights_keep_for must not be negative")
    if rec.forget_nodes_after < agents.lost_after:
        raise ConfigError(
            "reconciler.forget_nodes_after must be at least agents.lost_after: a node is lost before it is forgotten"
        )
    activator = config.activator
    if activator.queue_size < 0 or activator.max_wait <= 0 or activator.batch_after < 0:
        raise ConfigError("activator: queue_size and batch_after must not be negative and max_wait must be positive")
    for engine in config.engines:
        # Nodes refuse a name or version that may not name a folder: say so here, at start.
        try:
            check_engine_name(engine.name)
            check_version(engine.version, "engine version")
        except BadName as exc:
            raise ConfigError(f"engines: {exc}") from None
    names = [(e.name, e.version) for e in config.engines]
    if len(set(names)) != len(names):
        raise ConfigError("engines: an engine and version is listed twice")
    validate_models(config.models, config.engines)
    _validate_leadership(config)
    if config.models and not agents.listen:
        raise ConfigError("models need nodes to run on: set agents.listen (where llmgw-node connects)")


def _validate_listeners(config: ControlConfig) -> None:
    limits = config.listeners
    if limits.max_connections < 1:
        raise ConfigError(f"listeners.max_connections must be at least 1, got {limits.max_connections}")
    for field in ("head_timeout", "body_timeout", "write_timeout"):
        _check_positive(getattr(limits, field), f"listeners.{field}")
    if limits.body_min_rate < 1:
        raise ConfigError(f"listeners.body_min_rate must be at least 1 (bytes per second), got {limits.body_min_rate}")
    tls = config.client_tls
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError("client_tls: cert_file and key_file go together")
    for entry in tls.trusted_proxies:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(
                f"client_tls.trusted_proxies: {entry!r} is not an IP address or network, e.g. 10.0.0.5 or 10.1.0.0/16"
            ) from None


def _validate_leadership(config: ControlConfig) -> None:
    lead = config.leadership
    margin = min(1.0, lead.ttl / 5)
    if not (lead.ttl > 0 and 0 < lead.renew_interval < lead.ttl - margin):
        raise ConfigError(
            f"leadership: need 0 < renew_interval ({lead.renew_interval}) < ttl ({lead.ttl}) - "
            f"{margin:g} (the safety margin, min(1, ttl/5)), so a renew can fail once in time"
        )
    if lead.settle < 0:
        raise ConfigError(f"leadership.settle must not be negative, got {lead.settle}")
    if lead.advertise:
        parts = urlsplit(lead.advertise)
        try:
            parts.port  # noqa: B018 -- urlsplit validates the port lazily
        except ValueError:
            raise ConfigError(f"leadership.advertise: {lead.advertise!r} has an invalid port") from None
        if parts.scheme not in ("ws", "wss") or not parts.hostname or parts.query or parts.fragment:
            raise ConfigError(
                f"leadership.advertise: {lead.advertise!r} is not a ws:// or wss:// URL with a host, "
                "e.g. ws://10.0.0.2:8090/agent/v1"
            )
        if parts.hostname in ("0.0.0.0", "::"):
            raise ConfigError(f"leadership.advertise: {lead.advertise!r} names no host a node can reach")
    elif config.agents.listen and config.store.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            "leadership.advertise is required with a PostgreSQL store: when this daemon leads, "
            "standbys send nodes to that address (e.g. ws://10.0.0.2:8090/agent/v1)"
        )


def parse_endpoint_flag(text: str) -> StaticReplicaConfig:
    """``id=URL=model[,model]`` from the command line."""
    head, sep, models = text.rpartition("=")
    endpoint_id, sep2, url = head.partition("=")
    if not sep or not sep2 or not endpoint_id or not url or not models:
        raise ConfigError(f"--endpoint {text!r}: expected id=URL=model[,model], e.g. e1=http://127.0.0.1:8001=tiny")
    names = [m.strip() for m in models.split(",")]
    return StaticReplicaConfig(id=endpoint_id, url=url, models=names)


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
