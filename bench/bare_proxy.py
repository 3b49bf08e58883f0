"""The floor of this stack: the least an OpenAI proxy on hypercorn + httpx2 can do, for comparison.

    .venv/bin/python bench/run.py --bare    # measures this instead of llmgw-control

One hypercorn listener, one httpx2 connection pool used at the transport level, the request body
passed through and the answer relayed chunk by chunk: no parsing, checks, balancing, retries,
deadlines, disconnect handling, metrics or logs. It takes the same ``run --listen --endpoint``
arguments as ``llmgw-control`` so the bench drives it the same way. Whatever llmgw-control costs
above this is ours; what this costs is hypercorn's and httpx2's.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve


def make_app(upstream: str) -> Any:
    transport = httpx2.AsyncHTTPTransport(
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=512), trust_env=False
    )
    chat = httpx2.URL(upstream.rstrip("/") + "/v1/chat/completions")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["path"] == "/healthz":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = httpx2.Request("POST", chat, headers=[("content-type", "application/json")], content=body)
        response = await transport.handle_async_request(request)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [(b"content-type", response.headers.get("content-type", "").encode())],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bare_proxy.py")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--listen", required=True)
    run.add_argument("--admin-listen")
    run.add_argument("--endpoint", required=True, help="id=URL=model (only the URL is used)")
    args = parser.parse_args(argv)
    config = Config()
    config.bind = [args.listen]
    config.accesslog = None
    config.include_server_header = False
    trio.run(serve, make_app(args.endpoint.split("=")[1]), config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
