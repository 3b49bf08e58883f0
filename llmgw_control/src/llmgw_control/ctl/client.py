"""The CLI's only way to the daemon: the admin REST API over HTTP."""

from __future__ import annotations

import os
from typing import Any

import httpx2

from llmgw_shared.jsonin import loads as json_loads

DEFAULT_ADMIN = "http://127.0.0.1:8081"


class CtlError(Exception):
    """What the CLI prints as ``error: ...`` before exiting non-zero."""


# An admin key for an admin listener that requires one (off loopback, or admin_require_key):
# from the environment, never a command-line argument (ps shows those to everyone).
ADMIN_KEY_ENV = "LLMGW_ADMIN_KEY"


class AdminClient:
    def __init__(self, base_url: str, timeout: float = 30.0, *, admin_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        key = admin_key if admin_key is not None else os.environ.get(ADMIN_KEY_ENV, "")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self._http = httpx2.Client(base_url=self.base_url + "/api/v1", timeout=timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        """The answer's JSON (None for 204), or ``CtlError`` with the API's own message."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(method, path, json=json, params=query or None)
        except httpx2.TransportError as exc:
            raise CtlError(
                f"cannot reach the admin API at {self.base_url}: {exc} "
                "(is llmgw-control running? use --admin URL for another address)"
            ) from None
        if response.status_code == 204:
            return None
        try:
            body = json_loads(response.content)
        except ValueError:
            body = None
        if response.status_code >= 400:
            error = body.get("error") if isinstance(body, dict) else None
            if response.status_code == 401 and isinstance(error, dict) and error.get("code") == "admin_key_required":
                raise CtlError(f"{error.get('message')} (set {ADMIN_KEY_ENV} to an admin key for ctl)")
            if isinstance(error, dict) and error.get("code") == "standby":
                # One line naming the leader, so the operator re-runs the command there (ctl does
                # not retry on its own: which daemon acts stays the operator's choice).
                leader = error.get("leader") or "not known yet: retry in a moment"
                raise CtlError(
                    f"{self.base_url} is a standby control daemon; run this on the leader "
                    f"(its advertised address: {leader})"
                )
            if isinstance(error, dict) and error.get("message"):
                raise CtlError(f"{error['message']} (HTTP {response.status_code})")
            raise CtlError(f"{method} {path}: HTTP {response.status_code}: {response.text[:200]}")
        if body is None:
            raise CtlError(f"{method} {path}: the answer is not JSON")
        return body

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json=body)

    def put(self, path: str, body: Any) -> Any:
        return self.call("PUT", path, json=body)

    def patch(self, path: str, body: Any) -> Any:
        return self.call("PATCH", path, json=body)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)
