"""``[hub]``: where the mirror searches and downloads, and which other hosts it may fetch from."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

import attrs

from llmgw_shared.config import ConfigError
from llmgw_shared.config_doc import doc

# The environment variable holding a Hub token when no token_file is named (HF_TOKEN is the
# library's own name for it: an operator who already exports it needs nothing more).
TOKEN_ENV = ("LLMGW_HUB_TOKEN", "HF_TOKEN")


@attrs.frozen
class HubConfig:
    endpoint: str = attrs.field(
        default="https://huggingface.co",
        metadata=doc("The Hugging Face Hub, or a mirror of it, that searches and pulls go to."),
    )
    token_file: str = attrs.field(
        default="",
        metadata=doc("A file holding a Hub token (gated repositories); empty: $LLMGW_HUB_TOKEN or $HF_TOKEN."),
    )
    allow_hosts: list[str] = attrs.field(
        factory=list,
        metadata=doc("Other hosts a pull may download from (https URLs), besides the endpoint and where it redirects."),
    )
    redirect_hosts: list[str] = attrs.field(
        factory=lambda: ["cdn-lfs.huggingface.co", "cdn-lfs.hf.co", "cas-bridge.xethub.hf.co"],
        metadata=doc("Hosts the endpoint may redirect a download to (the Hub's LFS storage)."),
    )
    allow_networks: list[str] = attrs.field(
        factory=list,
        metadata=doc(
            "Loopback, private or link-local networks searches and pulls may reach anyway (a Hub mirror on the LAN)."
        ),
    )
    max_concurrent_pulls: int = attrs.field(
        default=2, metadata=doc("Pulls downloading at once; more wait their turn (each can fill a link on its own).")
    )
    search_limit: int = attrs.field(default=30, metadata=doc("Repositories one search lists at most."))
    timeout: float = attrs.field(
        default=20.0,
        metadata=doc("Seconds one Hub search or file listing may take, every request in it together (1..120)."),
    )

    def token(self) -> str | None:
        """The token, read when needed (never kept in the config's repr or logged)."""
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip() or None
            except OSError:
                return None
        for name in TOKEN_ENV:
            if os.environ.get(name):
                return os.environ[name].strip()
        return None


def validate_hub(hub: HubConfig) -> HubConfig:
    parts = urlsplit(hub.endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(
            f"hub.endpoint: {hub.endpoint!r} is not an http(s) URL with a host, e.g. https://huggingface.co"
        )
    if parts.username or parts.password:
        raise ConfigError("hub.endpoint: put the token in hub.token_file, not in the URL")
    try:
        parts.port  # noqa: B018 -- urlsplit validates the port lazily
    except ValueError:
        raise ConfigError(f"hub.endpoint: {hub.endpoint!r} has an invalid port") from None
    for host in [*hub.allow_hosts, *hub.redirect_hosts]:
        if not host or "/" in host or ":" in host or "@" in host or host != host.strip():
            raise ConfigError(f"hub.allow_hosts/redirect_hosts: {host!r} is not a host name (no scheme, port or path)")
    for net in hub.allow_networks:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ConfigError(f"hub.allow_networks: {net!r} is not a network, e.g. 127.0.0.0/8") from None
    if not 1 <= hub.max_concurrent_pulls <= 16:
        raise ConfigError(f"hub.max_concurrent_pulls must be 1..16, got {hub.max_concurrent_pulls}")
    if not 1 <= hub.search_limit <= 100:
        raise ConfigError(f"hub.search_limit must be 1..100, got {hub.search_limit}")
    if not 1 <= hub.timeout <= 120:
        raise ConfigError(f"hub.timeout must be 1..120 seconds, got {hub.timeout}")
    if hub.token_file and not Path(hub.token_file).is_file():
        raise ConfigError(f"hub.token_file: {hub.token_file!r} is not a file")
    return attrs.evolve(
        hub,
        endpoint=hub.endpoint.rstrip("/"),
        allow_hosts=[h.lower().rstrip(".") for h in hub.allow_hosts],
        redirect_hosts=[h.lower().rstrip(".") for h in hub.redirect_hosts],
    )
