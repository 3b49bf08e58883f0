"""An engine's HTTP surface as the node uses it: health, requests in flight, a free port.

llama-server answers ``/health`` without a key (200 once the model is loaded, 503 while
loading) and ``/slots`` / ``/metrics`` with the replica's key. Engines without ``/slots`` fall back
to the Prometheus text of ``/metrics``. vLLM and SGLang answer ``/health`` (200 once serving) and
publish their running and queued requests in ``/metrics``: vLLM as ``vllm:num_requests_running``
and ``vllm:num_requests_waiting``, SGLang as ``sglang:num_running_reqs`` and
``sglang:num_queue_reqs`` (one series per model or engine core; they are summed).
"""

from __future__ import annotations

import errno
import socket

import httpx2

# The series that count an engine's requests in flight: being processed, and queued for it.
BUSY_SERIES: dict[str, frozenset[str]] = {
    "llama.cpp": frozenset({"llamacpp:requests_processing", "llamacpp:requests_deferred"}),
    "vllm": frozenset({"vllm:num_requests_running", "vllm:num_requests_waiting"}),
    "sglang": frozenset({"sglang:num_running_reqs", "sglang:num_queue_reqs"}),
}


def base_url(host: str, port: int) -> str:
    # An engine bound to every address is reached on loopback from its own node.
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# The keep-alive race (docs/reliability.md): an engine may close a pooled connection as a probe
# goes out on it, and httpx2's pool re-sends only what it knows was never written. A probe is a
# GET, safe to send again, so one that fails before any answer goes once more (on a fresh
# connection: the pool has dropped the broken one) before it counts as the engine's failure.
_RACE_ERRORS = (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)


async def _get(
    client: httpx2.AsyncClient, url: str, *, headers: dict[str, str] | None = None, limit_s: float
) -> httpx2.Response:
    try:
        return await client.get(url, headers=headers, timeout=limit_s)
    except _RACE_ERRORS:
        return await client.get(url, headers=headers, timeout=limit_s)


async def healthy(client: httpx2.AsyncClient, host: str, port: int, *, limit_s: float) -> bool:
    try:
        resp = await _get(client, f"{base_url(host, port)}/health", limit_s=limit_s)
    except httpx2.HTTPError:
        return False
    return resp.status_code == 200


def busy_from_metrics(text: str, engine: str = "llama.cpp") -> int | None:
    """Requests processing plus waiting, from the engine's Prometheus text (None: no such series)."""
    series = BUSY_SERIES.get(engine, BUSY_SERIES["llama.cpp"])
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in series:
            try:
                value = float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            if value == value and value >= 0:  # not NaN
                total += value
                found = True
    return int(total) if found else None


async def in_flight(
    client: httpx2.AsyncClient, host: str, port: int, api_key: str, engine: str = "llama.cpp"
) -> int | None:
    """Requests the engine is working on or holding, or None when it will not say."""
    base = base_url(host, port)
    headers = {"Authorization": f"Bearer {api_key}"}
    if engine in ("vllm", "sglang"):
        try:
            resp = await _get(client, f"{base}/metrics", headers=headers, limit_s=2.0)
        except httpx2.HTTPError:
            return None
        return busy_from_metrics(resp.text, engine) if resp.status_code == 200 else None
    slots_idle = False
    try:
        resp = await _get(client, f"{base}/slots", headers=headers, limit_s=2.0)
        if resp.status_code == 200:
            slots = resp.json()
            if isinstance(slots, list):
                busy = sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
                if busy:
                    return busy
                slots_idle = True
        # Idle slots, yet requests may be queued for one: /metrics counts those too.
        resp = await _get(client, f"{base}/metrics", headers=headers, limit_s=2.0)
        if resp.status_code == 200:
            return busy_from_metrics(resp.text) or 0
    except (httpx2.HTTPError, ValueError):
        return None
    # /metrics is off (llama-server answers 501 without --metrics): idle slots are the best answer.
    return 0 if slots_idle else None


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True
