"""The node's configuration file (TOML), read into attrs classes.

Unknown keys are refused with their names, so a typo (``alow_os_packages``) is an error at
start-up instead of a setting silently ignored.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import attrs

from llmgw_node.engines.backends import BACKENDS, parse_backend
from llmgw_node.engines.signature import PublicKey, SignatureError, parse_public_key
from llmgw_node.model_dirs import ModelRoots
from llmgw_shared.config import ConfigError, load_toml, strict_converter, structure
from llmgw_shared.names import BadName, check_engine_name
from llmgw_shared.tracing import TracingConfig, validate_tracing

__all__ = ["ConfigError", "ConfiguredEngine", "NodeConfig", "load_config", "parse_config"]


@attrs.frozen
class ConfiguredEngine:
    """An engine that is not an archive (vLLM, SGLang, a local build), named on purpose by path."""

    name: str
    path: str
    # Reported as the engine's version; empty means the line its --version printed.
    version: str = ""
    # Arguments that make it print its version and exit.
    version_args: list[str] = attrs.field(factory=lambda: ["--version"])


@attrs.frozen
class NodeConfig:
    # Control URLs (ws:// or wss://, path /agent/v1), tried in order: a failover finds the leader.
    control: list[str] = attrs.field(factory=list)
    token: str = attrs.field(default="", repr=False)
    node_id: str = attrs.field(factory=socket.gethostname)
    data_dir: str = "/var/lib/llmgw-node"
    # The address engines listen on, and the one control is told to reach them at.
    engine_host: str = "127.0.0.1"
    address: str = ""
    # Install the OS packages that provide libraries an engine build lacks (apt-get or dnf, after
    # one index update per install). Needs root: under the shipped unit (user llmgw) the daemon
    # never tries, and the failure names each package and the command to install it.
    allow_os_packages: bool = False
    # minisign public keys (the base64 line of a .pub file). When set, every engine release index
    # must come with a signature by one of them at <index URL>.minisig, or nothing is installed
    # from it; the index lists each archive's sha256, so the signature pins the archives too.
    # Empty: indexes are trusted as fetched (GitHub over https, or control's own).
    release_signing_keys: list[str] = attrs.field(factory=list)
    # Keep each engine's downloaded archives (and the index they were chosen from) in its install
    # folder, so `llmgw-node engines check` can verify them against their digests again. Off by
    # default: it doubles the disk an engine takes (llama.cpp's CUDA builds are 0.5-1 GB packed).
    keep_engine_archives: bool = False
    # Which llama.cpp build this node installs: "" chooses by its devices (NVIDIA -> CUDA, AMD ->
    # ROCm, any other GPU -> Vulkan, CPU last); "cuda", "rocm", "vulkan" or "cpu" pins that one.
    engine_backend: str = ""
    # wss:// to control: the CA that signed control's certificate (empty: the system's CAs), and
    # this node's client certificate and key for mutual TLS (control may take the node id from it).
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    engines: list[ConfiguredEngine] = attrs.field(factory=list)
    # Directories a vLLM or SGLang profile's model_dir may be in (after symlinks), besides
    # <data_dir>/models and the Hub cache: a profile cannot point an engine anywhere else.
    model_roots: list[str] = attrs.field(factory=list)
    # The Hugging Face Hub cache ("hub:ORG/NAME@REV" model_dirs are snapshots there, in the Hub
    # client's layout); empty: <data_dir>/hub.
    hub_cache: str = ""
    # Seconds between re-checks of installed engines (ldd and --version).
    recheck_interval_s: float = 600.0
    # What one engine archive may unpack to. llama.cpp's CUDA 12 builds, the largest it
    # publishes, unpack to about 1.5-2 GB in a few dozen entries: 8 GiB and 4096 entries are
    # four and a hundred times that, and still bound what a hostile archive can write.
    unpack_max_bytes: int = 8 << 30
    unpack_max_entries: int = 4096
    # A failed install is tried again after this backoff (doubling, capped), however often
    # control asks: a bad release or a full disk fails the same way for a while, and each try
    # downloads the archive again. The cap is the re-check interval, which retries them anyway.
    install_retry_min_s: float = 30.0
    install_retry_max_s: float = 600.0
    # Reconnect backoff to control: first delay, cap.
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    log_level: str = "info"
    # OpenTelemetry traces of engine installs and replica starts (llmgw_shared/tracing.py).
    tracing: TracingConfig = attrs.field(factory=TracingConfig)

    @property
    def advertised_address(self) -> str:
        return self.address or self.engine_host

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def model_dir_roots(self) -> ModelRoots:
        roots = (self.data_path / "models", *(Path(r) for r in self.model_roots))
        return ModelRoots(roots, Path(self.hub_cache) if self.hub_cache else self.data_path / "hub")

    @property
    def signing_keys(self) -> list[PublicKey]:
        return [parse_public_key(key) for key in self.release_signing_keys]


_conv = strict_converter()


def parse_config(data: dict[str, Any], *, source: str = "config") -> NodeConfig:
    config = structure(data, NodeConfig, _conv, source=source)
    for url in config.control:
        if not url.startswith(("ws://", "wss://")):
            raise ConfigError(f"{source}: control: {url!r} is not a ws:// or wss:// URL")
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise ConfigError(f"{source}: tls_cert_file and tls_key_file go together (mutual TLS needs both)")
    names = [e.name for e in config.engines]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: engines: an engine name appears twice: {names}")
    for i, name in enumerate(names):
        try:
            check_engine_name(name)
        except BadName as exc:
            raise ConfigError(f"{source}: engines[{i}].name: {exc}") from None
    for i, key in enumerate(config.release_signing_keys):
        try:
            parse_public_key(key)
        except SignatureError as exc:
            raise ConfigError(f"{source}: release_signing_keys[{i}]: {exc}") from None
    for i, root in enumerate([*config.model_roots, *([config.hub_cache] if config.hub_cache else [])]):
        if not root.startswith("/"):
            raise ConfigError(
                f"{source}: {'hub_cache' if i == len(config.model_roots) else f'model_roots[{i}]'}: "
                f"{root!r} is not an absolute path"
            )
    for key in ("unpack_max_bytes", "unpack_max_entries", "install_retry_min_s", "install_retry_max_s"):
        if getattr(config, key) <= 0:
            raise ConfigError(f"{source}: {key}: must be more than 0")
    if config.engine_backend and parse_backend(config.engine_backend) is None:
        raise ConfigError(
            f"{source}: engine_backend: {config.engine_backend!r} is not one of "
            f"{', '.join(BACKENDS)} (or empty, to choose by the node's devices)"
        )
    if config.install_retry_min_s > config.install_retry_max_s:
        raise ConfigError(f"{source}: install_retry_min_s is more than install_retry_max_s")
    try:
        validate_tracing(config.tracing)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


def load_config(path: str | Path) -> NodeConfig:
    return parse_config(load_toml(path), source=str(path))
