"""The node's credentials on what it fetches from control, and on nothing else.

Control serves engine archives, their release index and weights only to enrolled nodes: a
request carries the node id and join token as HTTP Basic credentials (or, under mutual TLS, the
node's client certificate). The same HTTP client also fetches from GitHub, Hugging Face and any
weights URL a model names, so the credentials go only to the origins of the node's own control
URLs (``ws://host:port`` is ``http://host:port``, ``wss://`` is ``https://``); httpx drops the
header itself when a redirect leaves that origin.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from urllib.parse import urlsplit

import httpx2

from llmgw_node.config import NodeConfig
from llmgw_node.tls import client_context

_SCHEMES = {"ws": "http", "wss": "https", "http": "http", "https": "https"}
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, host: str | None, port: int | None) -> tuple[str, str, int] | None:
    scheme = _SCHEMES.get(scheme.lower(), "")
    if not scheme or not host:
        return None
    return scheme, host.lower(), port or _DEFAULT_PORTS[scheme]


class ControlCredentials(httpx2.Auth):
    """Basic ``node_id:token`` on requests to control's origins, when the request has no Authorization of its own."""

    def __init__(self, control_urls: Iterable[str], node_id: str, token: str) -> None:
        origins = set()
        for url in control_urls:
            parts = urlsplit(url)
            origin = _origin(parts.scheme, parts.hostname, parts.port)
            if origin is not None:
                origins.add(origin)
        self._origins = frozenset(origins)
        self._basic = httpx2.BasicAuth(node_id, token)

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        url = request.url
        if "authorization" not in request.headers and _origin(url.scheme, url.host, url.port) in self._origins:
            yield from self._basic.auth_flow(request)
        else:
            yield request


def control_client(config: NodeConfig) -> httpx2.AsyncClient:
    """The node's HTTP client: control's TLS (and client certificate) and credentials, on control's origins only.

    The daemon and every ``llmgw-node`` command that fetches (``engines install``, ``probe``) use
    it: from a closed fleet's control nothing is served to a client without them.
    """
    tls = client_context(config)
    return httpx2.AsyncClient(
        verify=tls if tls is not None else True, auth=ControlCredentials(config.control, config.node_id, config.token)
    )
