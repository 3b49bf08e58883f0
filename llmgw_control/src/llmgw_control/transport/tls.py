"""TLS on our listeners, and whether a client's connection is HTTPS: TLS on the client listener, or a
trusted TLS proxy in front.

``server_context`` builds the TLS context of every listener that terminates TLS (the client
listener here, the agents' TLS front in ``fleet/tls.py``).

Either way the ASGI scope's ``scheme`` says ``https``, which is what makes the dashboard's
session cookie ``Secure`` and its origin checks expect ``https://`` (admin/dashboard/login_views.py).

- Native TLS (``[client_tls] cert_file``/``key_file``): the connection loop does the handshake
  (``serving.py``), offering HTTP/1.1 only (ALPN), and hypercorn marks the scope ``https``. The
  files are read again on SIGHUP, so a renewed certificate needs no restart; a reload that fails
  keeps the certificate in use and says why.
- Behind a proxy that terminates TLS, only the peers listed in ``trusted_proxies`` may say so
  with ``X-Forwarded-Proto``: anyone else can send that header too.
"""

from __future__ import annotations

import ipaddress
import signal
import ssl
from collections.abc import Iterable
from typing import Any

import trio

from llmgw_shared.config import ConfigError
from llmgw_shared.logs import get_logger

from .asgi import Receive, Scope, Send

log = get_logger(__name__)


def server_context(cert_file: str, key_file: str, client_ca_file: str, *, what: str = "agents TLS") -> ssl.SSLContext:
    """A server's TLS context from PEM files (TLS 1.2 or later); ``ConfigError`` naming ``what`` if they do not load."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
        if client_ca_file:
            context.load_verify_locations(client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{what}: cannot load the certificate files: {exc}") from None
    return context


def client_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = server_context(cert_file, key_file, "", what="client_tls")
    # HTTP/1.1 is all the client listener speaks (docs/architecture.md).
    context.set_alpn_protocols(["http/1.1"])
    return context


class ClientTls:
    """The client listener's certificate: ``context()`` for each new connection, ``reload()`` on SIGHUP."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._context = client_context(cert_file, key_file)

    def context(self) -> ssl.SSLContext:
        return self._context

    def reload(self) -> bool:
        """Read the files again; connections already open keep the certificate they began with."""
        try:
            # A new context, swapped in whole: loading into the one in use could leave it with a
            # new certificate and the old key when the second file is bad.
            self._context = client_context(self.cert_file, self.key_file)
        except ConfigError as exc:
            log.error("the client listener's certificate was not reloaded (the one in use stays): %s", exc)
            return False
        log.info("the client listener's certificate was reloaded", extra={"cert_file": self.cert_file})
        return True


async def reload_on_sighup(
    tls: ClientTls | None, shutdown: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Reload ``tls`` on every SIGHUP until ``shutdown`` is set (then return).

    Installed with or without a certificate: SIGHUP's default action ends the process, and
    ``systemctl reload`` (the unit's ExecReload) must never stop the daemon.
    """
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            task_status.started()

            async def stop() -> None:
                await shutdown.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop)
            async for _ in signals:
                if tls is None:
                    log.info("SIGHUP: nothing to reload (no [client_tls] certificate)")
                else:
                    tls.reload()


_SCHEMES = {"http": {"https": "https", "http": "http"}, "websocket": {"https": "wss", "http": "ws"}}


class TrustedProxies:
    """ASGI: ``X-Forwarded-Proto`` sets the scope's scheme, for requests from a trusted proxy only."""

    def __init__(self, app: Any, proxies: Iterable[str]) -> None:
        self.app = app
        self.networks = tuple(ipaddress.ip_network(entry, strict=False) for entry in proxies)

    def trusts(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        schemes = _SCHEMES.get(scope["type"])
        client = scope.get("client")
        if schemes is not None and client and self.trusts(client[0]):
            forwarded = next((v for k, v in scope["headers"] if k == b"x-forwarded-proto"), None)
            # A proxy chain lists one scheme per hop; the first is what the client used.
            scheme = schemes.get(forwarded.decode("latin-1").split(",")[0].strip().lower()) if forwarded else None
            if scheme is not None:
                scope = dict(scope, scheme=scheme)
        await self.app(scope, receive, send)
