"""The Hub client's requests pass the URL guard one by one: a redirect or a ``Link: rel=next`` page
to another host (127.0.0.2 in any spelling) is refused before it is fetched, the Hub token goes to
the endpoint's origin only, and a Hub that pages for ever or answers what the library would retry
is stopped, not followed."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import httpx2
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_control.api_errors import AdminApiError
from llmgw_control.mirror.config import HubConfig
from llmgw_control.mirror.hub import Hub
from llmgw_control.mirror.hub_http import CURRENT_CALL, MAX_REQUESTS, GuardedTransport, HubCall, HubRefused
from llmgw_control.mirror.net_guard import NetGuard
from llmgw_dev.fake_hub import FakeHub, FakeRepo, run_fake_hub
from llmgw_shared.threads import HUB
from support.waiting import wait_until

LOOPBACK = ["127.0.0.0/8"]
REPOS = {"acme/tiny-GGUF": FakeRepo(files={"tiny.Q8_0.gguf": b"GGUF" + b"\0" * 60}, downloads=3)}
# 127.0.0.2 as a URL may spell it: each resolves to the other host.
SPELLINGS = ["127.0.0.2", "2130706434", "0x7f000002", "127.2", "0177.0.0.2", "127.0.0.2.", "[::ffff:127.0.0.2]"]


def _target(spelling: str, port: int, endpoint: str, form: str) -> str:
    if form == "userinfo":  # names the endpoint first, but 127.0.0.2 is the host
        return f"http://{endpoint.removeprefix('http://')}@{spelling}:{port}/api/models?cursor=2"
    if form == "https":
        return f"https://{spelling}:{port}/api/models?cursor=2"
    if form == "relative":  # a scheme-relative reference: same scheme, the other host
        return f"//{spelling}:{port}/api/models?cursor=2"
    return f"http://{spelling}:{port}/api/models?cursor=2"


async def _leak_attempt(tmp: Path, spelling: str, form: str, how: str, call: str, status: int) -> None:
    token = tmp / "token"
    token.write_text("hf_secret_token\n")
    async with (
        run_fake_hub(FakeHub(repos=dict(REPOS)), host="127.0.0.2") as other,
        run_fake_hub(FakeHub(repos=dict(REPOS))) as hub_fake,
    ):
        target = _target(spelling, int(other.url.rsplit(":", 1)[1]), hub_fake.url, form)
        if how == "redirect":
            hub_fake.api_redirect_to, hub_fake.api_redirect_status = target, status
        else:
            hub_fake.next_page = target
        hub = Hub(HubConfig(endpoint=hub_fake.url, token_file=str(token), allow_networks=LOOPBACK, timeout=3))
        with pytest.raises(AdminApiError) as caught:
            if call == "search":
                await hub.search("tiny")
            else:
                await hub.gguf_files("acme/tiny-GGUF")
        assert (caught.value.status, caught.value.code) == (502, "hub_refused"), caught.value
        assert other.seen == [], f"{target} was fetched"
        assert hub_fake.seen and hub_fake.seen[0].headers["authorization"] == "Bearer hf_secret_token"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spelling=st.sampled_from(SPELLINGS),
    form=st.sampled_from(["http", "https", "userinfo", "relative"]),
    how=st.sampled_from(["redirect", "link"]),
    call=st.sampled_from(["search", "tree"]),
    status=st.sampled_from([301, 302, 303, 307, 308]),
)
def test_no_redirect_or_next_page_reaches_another_host(
    tmp_path: Path, spelling: str, form: str, how: str, call: str, status: int
) -> None:
    trio.run(_leak_attempt, tmp_path, spelling, form, how, call, status)


async def test_a_next_page_on_the_endpoint_is_followed_with_the_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_secret_token\n")
    async with run_fake_hub(FakeHub(repos=dict(REPOS))) as fake:
        fake.next_page = f"{fake.url}/api/models/acme/tiny-GGUF/tree/main?cursor=2"
        hub = Hub(HubConfig(endpoint=fake.url, token_file=str(token), allow_networks=LOOPBACK))
        assert [f.path for f in await hub.gguf_files("acme/tiny-GGUF")] == ["tiny.Q8_0.gguf"] * 2
    assert [s.query.get("cursor") for s in fake.seen] == [None, ["2"]]
    assert all(s.headers["authorization"] == "Bearer hf_secret_token" for s in fake.seen)


async def test_a_hub_that_pages_for_ever_is_stopped() -> None:
    async with run_fake_hub(FakeHub(repos={})) as fake:
        fake.next_page, fake.endless_pages = f"{fake.url}/api/models?cursor=2", True
        with pytest.raises(AdminApiError) as caught:
            await Hub(HubConfig(endpoint=fake.url, allow_networks=LOOPBACK)).search("x")
    assert (caught.value.status, caught.value.code) == (502, "hub_refused")
    assert len(fake.seen) == MAX_REQUESTS


@pytest.mark.parametrize("status", [429, 503])
async def test_what_the_library_would_retry_is_answered_at_once(status: int) -> None:
    async with run_fake_hub(FakeHub(repos={})) as fake:
        fake.api_redirect_to, fake.api_redirect_status = "unused", status
        with trio.fail_after(3), pytest.raises(AdminApiError) as caught:
            await Hub(HubConfig(endpoint=fake.url, allow_networks=LOOPBACK)).search("x")
    assert (caught.value.status, caught.value.code) == (502, "hub_error")
    assert str(status) in caught.value.message and len(fake.seen) == 1


# ------------------------------------------------------------------ the transport alone


def _public(host: str, port: int) -> list[str]:
    return ["93.184.216.34"]


def _send(url: str, headers: dict[str, str], answer: httpx2.Response | None = None) -> httpx2.Request:
    """Send ``url`` through the transport under a call to https://hub.example; the request sent on."""
    sent: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return answer if answer is not None else httpx2.Response(200, content=b"[]")

    guard = NetGuard(HubConfig(endpoint="https://hub.example", allow_hosts=["files.example"]), resolve_blocking=_public)
    token = CURRENT_CALL.set(HubCall(guard, deadline=float("inf")))
    try:
        with httpx2.Client(transport=GuardedTransport(httpx2.MockTransport(handler))) as client:
            client.get(url, headers=headers).read()
    finally:
        CURRENT_CALL.reset(token)
    return sent[0]


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("https://hub.example/api/models", True),
        ("https://hub.example:443/x", True),
        ("https://files.example/x", False),
        ("https://hub.example:8443/x", False),
    ],
)
def test_the_token_goes_to_the_endpoint_origin_only(url: str, kept: bool) -> None:
    sent = _send(url, {"authorization": "Bearer t", "cookie": "c=1"})
    assert ("authorization" in sent.headers) is kept and ("cookie" in sent.headers) is kept
    assert sent.headers["accept-encoding"] == "identity"


def test_a_compressed_answer_is_refused() -> None:
    with pytest.raises(HubRefused, match="compressed"):
        _send(
            "https://hub.example/api/models",
            {},
            httpx2.Response(200, headers={"content-encoding": "gzip"}, content=b"x"),
        )


def test_a_request_outside_a_hub_call_is_refused() -> None:
    with (
        httpx2.Client(transport=GuardedTransport(httpx2.MockTransport(lambda r: httpx2.Response(200)))) as client,
        pytest.raises(HubRefused, match="outside"),
    ):
        client.get("https://hub.example/")


# ------------------------------------------------------------------ deadlines and addresses


async def _trickle(stream: trio.SocketStream) -> None:
    """Answer a head one byte at a time, each well inside any read timeout, for ever."""
    with trio.move_on_after(30):
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\n")
        try:
            while True:
                await stream.send_all(b"x")
                await trio.sleep(0.2)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def test_a_trickled_head_ends_at_the_calls_deadline_and_frees_its_thread() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, _trickle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        hub = Hub(HubConfig(endpoint=f"http://127.0.0.1:{port}", allow_networks=LOOPBACK, timeout=1.5))
        start = trio.current_time()
        with pytest.raises(AdminApiError) as caught:
            await hub.search("x")
        assert caught.value.status == 504 and trio.current_time() - start < 3
        # The thread itself ended (not only its caller): its token is back within the deadline's slack.
        await wait_until(lambda: HUB.limiter().available_tokens >= HUB.size, timeout=2)
        nursery.cancel_scope.cancel()


async def test_the_connection_goes_to_the_address_the_guard_checked() -> None:
    # hub.test resolves nowhere but in the guard: the connection uses the checked address, it does
    # not look the name up again (a DNS answer that changed in between is not followed).
    async with run_fake_hub(FakeHub(repos=dict(REPOS))) as fake:
        config = HubConfig(endpoint=fake.url.replace("127.0.0.1", "hub.test"), allow_networks=LOOPBACK)
        guard = NetGuard(config, resolve_blocking=lambda host, port: ["127.0.0.1"] if host == "hub.test" else [])
        assert [r.id for r in await Hub(config, guard).search("tiny")] == ["acme/tiny-GGUF"]
    assert fake.seen[0].headers["host"].startswith("hub.test:")
