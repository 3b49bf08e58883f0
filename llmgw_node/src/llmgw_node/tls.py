"""The TLS context for wss:// connections to control (server verification, optional client cert)."""

from __future__ import annotations

import ssl
from pathlib import Path

from llmgw_node.config import ConfigError, NodeConfig


def client_context(config: NodeConfig) -> ssl.SSLContext | None:
    """None when no control URL uses wss://; otherwise a verifying context, with our cert if set."""
    if not any(url.startswith("wss://") for url in config.control):
        return None
    for what, path in (
        ("tls_ca_file", config.tls_ca_file),
        ("tls_cert_file", config.tls_cert_file),
        ("tls_key_file", config.tls_key_file),
    ):
        if path and not Path(path).is_file():
            raise ConfigError(f"{what}: {path}: no such file")
    try:
        context = ssl.create_default_context(cafile=config.tls_ca_file or None)
        if config.tls_cert_file:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"TLS: cannot load the certificate files: {exc}") from None
    return context
