"""The daemon as a process: graceful shutdown on SIGTERM, and what its logs do and do not say."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
import trio
import trio.testing

from llmgw_dev.engine_proc import free_port
from llmgw_dev.fake_engine import FakeEngine
from support.gateway import chat_body, endpoint, running_gateway
from support.waiting import wait_until

# Starts llmgw daemons as processes (the quick tier, -m "not system", leaves these out).
pytestmark = pytest.mark.system


LLMGW_CONTROL = str(Path(sys.executable).with_name("llmgw-control"))


async def test_in_flight_stream_finishes_after_shutdown_and_new_connections_are_refused(
    fake_engine: FakeEngine,
) -> None:
    fake_engine.behavior.chunks = 20
    fake_engine.behavior.chunk_delay = 0.05
    async with running_gateway(endpoint("e1", fake_engine.url), grace=10) as gw:
        received = b""
        async with httpx2.AsyncClient(base_url=gw.url) as client:
            async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
                async for chunk in response.aiter_bytes():
                    if not gw.shutdown.is_set():
                        gw.shutdown.set()
                        with trio.fail_after(10):
                            # What the stop set in motion (the listeners closing) has run.
                            await trio.testing.wait_all_tasks_blocked(0.01)
                        async with httpx2.AsyncClient(base_url=gw.url) as late:
                            try:
                                await late.get("/healthz")
                                refused = False
                            except httpx2.ConnectError:
                                refused = True
                        assert refused, "a new connection was accepted after shutdown began"
                    received += chunk
        assert received.rstrip().endswith(b"data: [DONE]")
        assert received.count(b"tok") == 20


@asynccontextmanager
async def control_process(*args: str, log_path: Path) -> AsyncIterator[tuple[trio.Process, str]]:
    port = free_port()
    args = ("--data-dir", str(log_path.parent / "control-data"), *args)
    with open(log_path, "wb") as log:  # noqa: ASYNC230 -- a local file, opened once
        process = await trio.lowlevel.open_process(
            [
                LLMGW_CONTROL,
                "run",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{free_port()}",
                "--log-format",
                "json",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx2.AsyncClient() as client:

            async def healthy() -> bool:
                try:
                    return (await client.get(url + "/healthz")).status_code == 200
                except httpx2.ConnectError:
                    return False

            await wait_until(healthy, timeout=20)
        yield process, url
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_sigterm_lets_the_stream_finish_and_exits_zero(fake_engine: FakeEngine, tmp_path: Path) -> None:
    fake_engine.behavior.chunks = 10
    fake_engine.behavior.chunk_delay = 0.1
    async with control_process(f"--endpoint=e1={fake_engine.url}=fake-model", log_path=tmp_path / "log") as (proc, url):
        received = b""
        async with httpx2.AsyncClient(base_url=url) as client:
            async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
                async for chunk in response.aiter_bytes():
                    if not received:
                        proc.send_signal(signal.SIGTERM)
                    received += chunk
        with trio.fail_after(10):
            assert await proc.wait() == 0
    assert received.rstrip().endswith(b"data: [DONE]")


async def test_shutdown_grace_bounds_a_stream_that_would_not_end(fake_engine: FakeEngine, tmp_path: Path) -> None:
    fake_engine.behavior.hang_mid_stream_after = 1
    config = tmp_path / "control.toml"
    config.write_text(
        f'shutdown_grace = 0.5\n[[endpoints]]\nid = "e1"\nurl = "{fake_engine.url}"\nmodels = ["fake-model"]\n'
    )
    async with control_process("--config", str(config), log_path=tmp_path / "log") as (proc, url):
        async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
            async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
                async for _ in response.aiter_bytes():
                    proc.send_signal(signal.SIGTERM)
                    break
                with trio.fail_after(10):
                    assert await proc.wait() == 0
    with trio.fail_after(5):
        await fake_engine.observed.wait_disconnects(1)


async def test_logs_carry_request_ids_and_never_secrets(fake_engine: FakeEngine, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    log_path = tmp_path / "log"
    secret = "sk-llmgw-Zq9secretvalue"
    # The dead replica weighs most, so the first request always tries it first and logs the
    # retry warning (with equal weights the pick is random and might never land on it).
    config = tmp_path / "control.toml"
    config.write_text(
        f'[[endpoints]]\nid = "dead"\nurl = "{dead}"\nmodels = ["fake-model"]\nweight = 100.0\n'
        f'[[endpoints]]\nid = "e1"\nurl = "{fake_engine.url}"\nmodels = ["fake-model"]\n'
    )
    async with control_process("--config", str(config), log_path=log_path) as (proc, url):
        async with httpx2.AsyncClient(base_url=url) as client:
            for _ in range(3):
                response = await client.post(
                    "/v1/chat/completions",
                    json=chat_body(),
                    headers={"authorization": f"Bearer {secret}", "x-request-id": "req-42"},
                )
                assert response.status_code == 200
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await proc.wait()
    text = log_path.read_text()
    assert secret not in text and "Zq9secret" not in text
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    request_lines = [line for line in lines if line.get("request_id") == "req-42"]
    # The retry warning and the access line both carry the request id.
    assert any(line["logger"].startswith("llmgw_control.gateway.") and "dead" in line["msg"] for line in request_lines)
    assert sum(line["logger"] == "llmgw.access" for line in request_lines) == 3
    assert all(line["level"] for line in lines)


async def test_config_errors_are_refused_at_start_by_name(tmp_path: Path) -> None:
    cases = {
        ("--endpoint", "nonsense"): "expected id=URL=model",
        ("--endpoint", "e1=ftp://x=m"): "not an http(s) URL",
        ("--listen", "8080"): "expected host:port",
        ("--listen", "127.0.0.1:99999"): "port must be a number",
    }
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[router]\nconect_timeout = 3\n")
    cases[("--config", str(bad_toml))] = "unknown key 'conect_timeout'"
    wrong_type = tmp_path / "type.toml"
    wrong_type.write_text('[router]\nmax_attempts = "3"\n')
    cases[("--config", str(wrong_type))] = "router.max_attempts: expected an integer"
    duplicate = tmp_path / "dup.toml"
    duplicate.write_text('[[endpoints]]\nid = "a"\nurl = "http://h:1"\nmodels = ["m"]\n' * 2)
    cases[("--config", str(duplicate))] = "is used by another endpoint"
    cases[("--config", str(tmp_path / "missing.toml"))] = "no such file"
    for args, expected in cases.items():
        result = await trio.run_process(
            [LLMGW_CONTROL, "run", *args], capture_stdout=True, capture_stderr=True, check=False
        )
        assert result.returncode == 2, args
        assert expected in result.stderr.decode(), (args, result.stderr)
        assert b"Traceback" not in result.stderr


async def test_a_busy_port_is_reported_without_a_traceback(tmp_path: Path) -> None:
    port = free_port()
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", port))
        sock.listen()
        result = await trio.run_process(
            [
                LLMGW_CONTROL,
                "run",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{free_port()}",
                "--data-dir",
                str(tmp_path),
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1
    assert b"cannot start" in result.stderr and b"Traceback" not in result.stderr
