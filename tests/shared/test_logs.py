"""The shared logging setup: structured lines, request ids, secrets scrubbed."""

from __future__ import annotations

import io
import json

import pytest

from llmgw_shared.logs import get_logger, redact, request_context, setup_logging


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Bearer sk-abc.def-123",
        "headers={'authorization': 'Bearer xyz'}",
        "api_key=supersecret",
        '{"token": "llmgw-join-abcdef"}',
        "key sk-llmgw-0123456789abcdef",
        "join_token: tok_12345",
    ],
)
def test_secrets_are_scrubbed(text: str) -> None:
    cleaned = redact(text)
    for secret in ("abc.def-123", "xyz", "supersecret", "abcdef", "0123456789abcdef", "tok_12345"):
        assert secret not in cleaned


def test_json_lines_carry_request_id_and_fields() -> None:
    stream = io.StringIO()
    setup_logging("info", json_lines=True, stream=stream)
    log = get_logger("test")
    with request_context("rid-1"):
        log.info(
            "hello %s",
            "world",
            extra={
                "model": "m",
                "authorization": "Bearer nope",
                "api_key": "plain",
                "join_token": "plain2",
                "prompt_tokens": 12,
            },
        )
    log.info("outside")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "hello world" and first["request_id"] == "rid-1" and first["model"] == "m"
    assert "nope" not in json.dumps(first) and "plain" not in json.dumps(first)
    assert first["prompt_tokens"] == 12
    assert "request_id" not in second
    assert first["logger"] == "llmgw.test"


def test_text_lines_for_people() -> None:
    stream = io.StringIO()
    setup_logging("debug", json_lines=False, stream=stream)
    with request_context("rid-2"):
        get_logger("llmgw.x").warning("careful", extra={"n": 3})
    line = stream.getvalue().strip()
    assert "warning" in line and "careful" in line and "n=3" in line and "request_id=rid-2" in line


def test_every_module_logs_under_its_own_name() -> None:
    # Hand-typed logger names drift from the modules (one module logged under another's name,
    # the gateway as "llmgw.router"): each module's logger is its __name__ (issue 33). The access
    # log alone is a named channel, as hypercorn's and uvicorn's are: a stream, not a module.
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    typed = re.compile(r"get_logger\((?!__name__\))")
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for package in ("llmgw_control", "llmgw_node", "shared")
        for path in (root / package / "src").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if typed.search(line) and "def get_logger" not in line and 'get_logger("llmgw.access")' not in line
    ]
    assert found == []
