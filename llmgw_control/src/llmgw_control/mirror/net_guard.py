"""Which URLs a pull may fetch: the one check every download URL and every redirect passes.

A pull URL comes from an operator's API call and redirects come from remote servers, so both
are hostile: a URL must not make control fetch its own admin listener, a cloud metadata
address or a machine on the LAN. A URL is allowed when

- its scheme is https (http only for the configured endpoint itself, e.g. a LAN mirror),
- it carries no userinfo (``https://huggingface.co@10.0.0.1/`` names 10.0.0.1),
- its host, normalised by IDNA, is the Hub endpoint's, one of ``allow_hosts``, or (for a
  redirect the endpoint sent) one of ``redirect_hosts``,
- and **every** address the host resolves to is public, or inside ``allow_networks``.

The host is resolved here, by the same resolver the connection uses, and checked on each hop
(redirects are followed one at a time by the downloader; the Hub client's transport checks
each request it sends, every redirect and next page among them, with ``check_blocking``). Literal
addresses in any spelling the resolver accepts (decimal ``2130706433``, octal, IPv6, IPv4-mapped
IPv6) resolve to what they mean, and are judged by that.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import attrs
import trio

from .config import HubConfig

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
BlockingResolver = Callable[[str, int], list[str]]

# A host name in a URL is at most 253 characters in DNS; longer is refused before resolving.
_MAX_HOST = 253


class UrlRefused(ValueError):
    """A URL a pull may not fetch, with the reason (safe to show the operator)."""


@attrs.frozen
class CheckedUrl:
    url: str
    host: str
    port: int
    addresses: tuple[str, ...]


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def blocking_resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


def _normal_host(host: str) -> str:
    try:
        return host.encode("idna").decode("ascii").lower().rstrip(".")
    except (UnicodeError, ValueError):
        raise UrlRefused(f"host {host!r} is not a valid host name") from None


class NetGuard:
    def __init__(
        self, hub: HubConfig, resolve: Resolver = system_resolve, resolve_blocking: BlockingResolver = blocking_resolve
    ) -> None:
        self.hub = hub
        self._resolve = resolve
        self._resolve_blocking = resolve_blocking
        endpoint = urlsplit(hub.endpoint)
        self.endpoint_host = _normal_host(endpoint.hostname or "")
        self.endpoint_scheme = endpoint.scheme
        self.endpoint_port = endpoint.port
        self.networks = [ipaddress.ip_network(n, strict=False) for n in hub.allow_networks]

    def _address_allowed(self, text: str) -> bool:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            mapped: IPAddress = address.ipv4_mapped
            if any(mapped in net for net in self.networks):
                return True
        return _public(address) or any(address in net for net in self.networks)

    async def check(self, url: str, *, redirect: bool = False) -> CheckedUrl:
        """The URL's target when a pull may fetch it; ``UrlRefused`` otherwise."""
        host, port = self._judge_url(url, redirect)
        try:
            addresses = await self._resolve(host, port)
        except OSError as exc:
            raise UrlRefused(f"host {host!r} does not resolve ({exc.strerror or exc})") from None
        return self._judge_addresses(url, host, port, addresses)

    def check_blocking(self, url: str, *, redirect: bool = False) -> CheckedUrl:
        """``check`` from a worker thread (the Hub client's transport): the same rules, resolved
        by the blocking resolver the thread's own connection then uses."""
        host, port = self._judge_url(url, redirect)
        try:
            addresses = self._resolve_blocking(host, port)
        except OSError as exc:
            raise UrlRefused(f"host {host!r} does not resolve ({exc.strerror or exc})") from None
        return self._judge_addresses(url, host, port, addresses)

    def same_origin(self, url: str) -> bool:
        """Whether ``url`` is the Hub endpoint's own origin (scheme, host, port): the one place
        a Hub token may be sent."""
        try:
            parts = urlsplit(url)
            port = parts.port
            host = _normal_host(parts.hostname or "")
        except (ValueError, UrlRefused):
            return False
        default = {"https": 443, "http": 80}
        return (
            parts.scheme == self.endpoint_scheme
            and host == self.endpoint_host
            and (port or default.get(parts.scheme)) == (self.endpoint_port or default.get(self.endpoint_scheme))
        )

    def _judge_url(self, url: str, redirect: bool) -> tuple[str, int]:
        if len(url) > 4096 or any(ord(c) < 0x21 or c == "\x7f" for c in url):
            raise UrlRefused("the URL is too long or holds spaces or control characters")
        try:
            parts = urlsplit(url)
            raw_host = parts.hostname
            port = parts.port
        except ValueError:  # an unbalanced [ ], a port that is not a number or out of range
            raise UrlRefused("the URL is malformed (its host or port)") from None
        if parts.username is not None or parts.password is not None or "@" in parts.netloc:
            raise UrlRefused("the URL carries user information (user@host): not allowed")
        if not raw_host or len(raw_host) > _MAX_HOST:
            raise UrlRefused("the URL names no host")
        host = _normal_host(raw_host)
        is_endpoint = host == self.endpoint_host and port == self.endpoint_port
        if parts.scheme != "https" and not (is_endpoint and parts.scheme == self.endpoint_scheme):
            raise UrlRefused(f"only https URLs may be pulled, not {parts.scheme or 'no scheme'}")
        allowed = (
            host == self.endpoint_host or host in self.hub.allow_hosts or (redirect and host in self.hub.redirect_hosts)
        )
        if not allowed:
            raise UrlRefused(f"host {host!r} is not the Hub endpoint or in hub.allow_hosts")
        return host, port or (443 if parts.scheme == "https" else 80)

    def _judge_addresses(self, url: str, host: str, port: int, addresses: list[str]) -> CheckedUrl:
        if not addresses:
            raise UrlRefused(f"host {host!r} does not resolve")
        for address in addresses:
            if not self._address_allowed(address):
                raise UrlRefused(
                    f"host {host!r} resolves to {address}, a loopback, private or link-local "
                    "address (allow it in hub.allow_networks if it is meant)"
                )
        return CheckedUrl(url, host, port, tuple(addresses))
