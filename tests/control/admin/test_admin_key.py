"""The admin listener off loopback: an admin key on every request, checked on the head, or no start at all.

Tests listen on 127.0.0.1 only, so the key requirement is switched on with ``admin_require_key``
(the same guard a non-loopback ``admin_listen`` turns on); which addresses count as loopback is
tested on its own, and the refusal to start off loopback happens before anything is bound.
"""

from __future__ import annotations

import io
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx2
import pytest
import tomli_w
import trio

from llmgw_control.admin.admin_auth import is_loopback
from llmgw_control.app import run_control
from llmgw_control.config import ControlConfig, validate
from llmgw_control.ctl import main as ctl
from llmgw_shared.config import ConfigError

from .conftest import running_control

REQUIRE = {"admin_require_key": True}


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:8081", True),
        ("127.9.9.9:8081", True),
        ("[::1]:8081", True),
        ("localhost:8081", True),
        ("0.0.0.0:8081", False),
        ("[::]:8081", False),
        ("10.0.0.5:8081", False),
        ("admin.internal:8081", False),
    ],
)
def test_which_addresses_are_loopback(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


async def admin_keys(tmp_path: Path) -> dict[str, str]:
    """Keys made on an unguarded loopback daemon first, as an operator would: admin, plain, revoked."""
    async with running_control(tmp_path) as daemon:
        group = (await daemon.admin.post("/groups", json={"name": "ops"})).json()["group"]["id"]
        made = {}
        for name, admin in (("admin", True), ("plain", False), ("revoked", True)):
            answer = await daemon.admin.post("/keys", json={"name": name, "group_id": group, "admin": admin})
            assert answer.status_code == 201, answer.text
            made[name] = answer.json()["secret"]
            if name == "revoked":
                await daemon.admin.post(f"/keys/{answer.json()['key']['id']}/revoke")
        return made


async def test_every_admin_request_needs_a_live_admin_key(tmp_path: Path) -> None:
    keys = await admin_keys(tmp_path)
    async with (
        running_control(tmp_path, control_settings=REQUIRE) as daemon,
        httpx2.AsyncClient(base_url=daemon.admin_url, timeout=10) as client,
    ):
        for path in ("/api/v1/nodes", "/api/v1/keys", "/metrics", "/", "/api/v1/openapi.json", "/nope"):
            for headers in (
                {},
                {"authorization": f"Bearer {keys['plain']}"},
                {"authorization": f"Bearer {keys['revoked']}"},
                {"authorization": "Bearer sk-wrong"},
                {"authorization": keys["admin"]},
            ):
                response = await client.get(path, headers=headers)
                assert response.status_code == 401, (path, headers, response.text)
                assert response.json()["error"]["code"] == "admin_key_required"
                assert response.headers["www-authenticate"].startswith("Bearer")
        good = {"authorization": f"Bearer {keys['admin']}"}
        assert (await client.get("/api/v1/nodes", headers=good)).status_code == 200
        assert (await client.get("/metrics", headers=good)).status_code == 200
        assert (await client.post("/api/v1/groups", json={"name": "team"}, headers=good)).status_code == 201
        # Load balancers keep their health check.
        assert (await client.get("/healthz")).status_code == 200


async def test_the_key_is_checked_on_the_head_before_any_body(tmp_path: Path) -> None:
    await admin_keys(tmp_path)
    async with running_control(tmp_path, control_settings=REQUIRE) as daemon:
        host, port = daemon.admin_url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        # A head promising 30 MB that never come: the answer must not wait for them.
        await stream.send_all(
            b"POST /api/v1/groups HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: 31457280\r\n\r\n"
        )
        answer = b""
        with trio.fail_after(5):
            while b"\r\n\r\n" not in answer:
                answer += await stream.receive_some(4096)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        await stream.aclose()


async def test_ctl_sends_the_key_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = await admin_keys(tmp_path)
    async with running_control(tmp_path, control_settings=REQUIRE) as daemon:

        async def run(*argv: str) -> tuple[int, str, str]:
            out, err = io.StringIO(), io.StringIO()
            code = await trio.to_thread.run_sync(
                lambda: ctl(["--admin", daemon.admin_url, *argv], stdout=out, stderr=err)
            )
            return code, out.getvalue(), err.getvalue()

        monkeypatch.delenv("LLMGW_ADMIN_KEY", raising=False)
        code, _, err = await run("groups")
        assert code == 1 and "LLMGW_ADMIN_KEY" in err
        monkeypatch.setenv("LLMGW_ADMIN_KEY", keys["admin"])
        code, out, err = await run("groups")
        assert code == 0 and "ops" in out, err


async def test_no_start_when_no_admin_key_could_open_the_listener(tmp_path: Path) -> None:
    # Off loopback: refused before any listener is bound (so this binds nothing).
    for settings in ({"admin_listen": "0.0.0.0:0"}, {"admin_listen": "127.0.0.1:0", **REQUIRE}):
        config = validate(ControlConfig(listen="127.0.0.1:0", data_dir=str(tmp_path), **settings))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="no admin key exists") as raised:
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(partial(run_control, config))
            except BaseExceptionGroup as group:
                raise only_leaf(group) from None
        assert "--admin-key" in str(raised.value) and "127.0.0.1" in str(raised.value)


def only_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        (error,) = error.exceptions
    return error


@pytest.mark.slow  # left out of the quick tier: the daemon as a process
def test_the_daemon_says_so_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "control.toml"
    config.write_text(
        tomli_w.dumps({"listen": "127.0.0.1:0", "admin_listen": "0.0.0.0:0", "data_dir": str(tmp_path / "data")})
    )
    ran = subprocess.run(
        [str(Path(sys.executable).parent / "llmgw-control"), "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 1
    assert "cannot start: admin_listen 0.0.0.0:0 is not a loopback address" in ran.stderr
    assert "Traceback" not in ran.stderr
