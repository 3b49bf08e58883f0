"""The mirror's SSRF guard over hostile URLs: userinfo, IPv6, decimal/octal/hex IPs, IDNA, ports,
and host names that resolve (wholly or in part) to loopback, private or link-local addresses."""

from __future__ import annotations

import ipaddress

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_control.mirror.config import HubConfig
from llmgw_control.mirror.net_guard import NetGuard, UrlRefused, system_resolve

PUBLIC = "93.184.216.34"
NOT_PUBLIC = [
    "127.0.0.1",
    "127.255.0.7",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "169.254.169.254",
    "0.0.0.0",
    "100.64.0.1",
    "::1",
    "fe80::1",
    "fc00::1",
    "fd12:3456::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::",
    "224.0.0.1",
    "255.255.255.255",
]


def table_resolver(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(host: str, port: int) -> list[str]:
        if host in table:
            return table[host]
        return await system_resolve(host, port)  # literals only: the tests never reach DNS

    return resolve


def run(guard: NetGuard, url: str, redirect: bool = False) -> object:
    async def main() -> object:
        return await guard.check(url, redirect=redirect)

    return trio.run(main)


HUB = HubConfig(
    endpoint="https://hub.example",
    allow_hosts=["files.example", "2130706433", "0x7f000001", "0177.0.0.1", "127.1"],
    redirect_hosts=["cdn.example"],
)


def guard_for(table: dict[str, list[str]], hub: HubConfig = HUB) -> NetGuard:
    return NetGuard(hub, table_resolver(table))


def test_public_endpoint_and_allowed_hosts_pass() -> None:
    guard = guard_for({"hub.example": [PUBLIC], "files.example": [PUBLIC], "cdn.example": [PUBLIC]})
    assert run(guard, "https://hub.example/r/resolve/main/m.gguf")
    assert run(guard, "https://files.example:8443/m.gguf")
    assert run(guard, "https://cdn.example/blob", redirect=True)


def test_redirect_hosts_only_for_redirects() -> None:
    guard = guard_for({"cdn.example": [PUBLIC]})
    with pytest.raises(UrlRefused, match="not the Hub endpoint"):
        run(guard, "https://cdn.example/blob")


@pytest.mark.parametrize(
    "url",
    [
        "https://hub.example@10.0.0.1/m.gguf",
        "https://user:pw@hub.example/m.gguf",
        "https://@hub.example/x",
        "http://files.example/m.gguf",
        "ftp://hub.example/m",
        "file:///etc/passwd",
        "https:///nohost",
        "https://hub.example:99999/m",
        "https://hub.example:-1/m",
        "https://hub.example/a b",
        "https://other.example/m.gguf",
        "https://hub.example.evil.example/m",
        "https://[::1]/m",
        "https://127.0.0.1/m",
        "https://localhost/m",
        # decimal, hex, octal and short forms of 127.0.0.1: allowed by name, refused by what they mean
        "https://2130706433/m",
        "https://0x7f000001/m",
        "https://0177.0.0.1/m",
        "https://127.1/m",
    ],
)
def test_hostile_urls_refused(url: str) -> None:
    guard = guard_for({"hub.example": [PUBLIC], "files.example": [PUBLIC]})
    with pytest.raises(UrlRefused):
        run(guard, url)


def test_idna_host_is_normalised_before_matching() -> None:
    # A full-width spelling of an allowed host is that host, and is judged by its addresses.
    guard = guard_for({"files.example": ["10.0.0.8"]})
    with pytest.raises(UrlRefused, match="private"):
        run(guard, "https://\uff46\uff49\uff4c\uff45\uff53.example/m.gguf")
    with pytest.raises(UrlRefused):
        run(guard, "https://xn--invalid-\udcff.example/m")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bad=st.sampled_from(NOT_PUBLIC),
    extra=st.lists(st.just(PUBLIC), max_size=2),
    host=st.sampled_from(["hub.example", "files.example"]),
    redirect=st.booleans(),
)
def test_any_non_public_address_among_a_hosts_addresses_refuses_it(
    bad: str, extra: list[str], host: str, redirect: bool
) -> None:
    guard = guard_for({host: [*extra, bad]})
    with pytest.raises(UrlRefused, match="loopback, private or link-local"):
        run(guard, f"https://{host}/m.gguf", redirect)


def test_allow_networks_lets_a_lan_mirror_through() -> None:
    hub = HubConfig(endpoint="http://127.0.0.1:9000", allow_networks=["127.0.0.0/8"])
    guard = guard_for({}, hub)
    assert run(guard, "http://127.0.0.1:9000/api/models")
    with pytest.raises(UrlRefused):  # plain http only to the endpoint itself
        run(guard, "http://127.0.0.1:9001/api/models")
    # The allowed network does not open the others.
    guard = guard_for({"127.0.0.1": ["127.0.0.1", "10.0.0.1"]}, hub)
    with pytest.raises(UrlRefused, match=r"10\.0\.0\.1"):
        run(guard, "http://127.0.0.1:9000/m")


_hosts = st.one_of(
    st.sampled_from(
        [
            "hub.example",
            "files.example",
            "cdn.example",
            "localhost",
            "[::1]",
            "[fe80::1%25eth0]",
            "[::ffff:127.0.0.1]",
            "2130706433",
            "0x7f.1",
            "017700000001",
            "127.000.000.001",
            "\uff48\uff55\uff42.example",
            "hub.example.",
            "HUB.EXAMPLE",
            "xn--80ak6aa92e.com",
            "",
            "[",
            "]",
        ]
    ),
    st.text(min_size=1, max_size=20),
)
_userinfo = st.sampled_from(["", "user@", "user:pass@", "hub.example@", "@", ":@"])
_ports = st.sampled_from(["", ":443", ":0", ":65536", ":abc", ":8443", ": 1"])


@settings(max_examples=400, deadline=None)
@given(
    scheme=st.sampled_from(["https", "http", "HTTPS", "ftp", "", "javascript"]),
    userinfo=_userinfo,
    host=_hosts,
    port=_ports,
    path=st.text(max_size=20),
    redirect=st.booleans(),
)
def test_hostile_urls_are_refused_or_land_only_on_public_addresses(
    scheme: str, userinfo: str, host: str, port: str, path: str, redirect: bool
) -> None:
    # hub.example and files.example resolve to public addresses; everything else is a literal or fails.
    guard = guard_for({"hub.example": [PUBLIC], "files.example": [PUBLIC], "cdn.example": [PUBLIC]})
    url = f"{scheme}://{userinfo}{host}{port}/{path}"
    try:
        target = run(guard, url, redirect)
    except UrlRefused:
        return
    assert not userinfo
    assert target.host in ("hub.example", "files.example", "cdn.example")  # type: ignore[attr-defined]
    for address in target.addresses:  # type: ignore[attr-defined]
        assert ipaddress.ip_address(address).is_global
