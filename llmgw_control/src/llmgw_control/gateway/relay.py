"""One attempt's exchange with an engine: the request sent, the answer relayed to the client.

Deadlines are trio scopes per phase (the response head, then the idle gap between chunks), so an
error names the replica and the phase. The attempt ends with an outcome (gateway/attempts.py), a
value the gateway's policy table turns into the next step: a failure before anything reached the
client is a ``Retry`` (another replica), one after is ``Broken`` (continued elsewhere, or the stream
ends with a last ``data: {"error": ...}`` event). A streamed answer is read by a task of its own
into a bounded queue, and everything queued leaves as one write (docs/performance.md).

Every scope that waits on the engine is registered with the replica's ``Progress``
(gateway/hang_watch.py), and every byte from it counts as progress: a replica found hung has
those scopes cancelled, and the attempt's outcome says so (reason ``hung``).
"""

from __future__ import annotations

import json
import math
import time

import trio

from llmgw_shared.jsonin import loads as json_loads
from llmgw_shared.logs import get_logger

from ..api_errors import ClientApiError
from .adapters import adapter_fields
from .attempts import ANSWERED, Broken, Outcome, Refused, Retry, Stalled
from .config import GatewayConfig
from .continuation import StreamRecord
from .exchange import Exchange
from .replicas import Replica
from .requests import ParsedRequest
from .upstream import UpstreamBodyError, UpstreamClient, UpstreamResponse
from .usage import StreamTail, UsageBounds, find_usage, usage_bounds

log = get_logger(__name__)

# An engine's error answer (a 5xx) is read up to this much for the message the client gets: the
# message is cut to 300 characters anyway, and a broken engine may send anything.
_ERROR_BODY_LIMIT = 64 * 1024
# Chunks read ahead of a slow client before the reader waits (backpressure to the engine): a
# client that stops reading holds at most this many of the engine's chunks in memory.
_RELAY_QUEUE = 64


def engine_message(body: bytes) -> str:
    """The engine's error message in ``body`` (its JSON error, else the text), at most 300 characters."""
    try:
        value = json_loads(body)
        error = value.get("error") if isinstance(value, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
        if isinstance(error, str):
            return error[:300]
    except ValueError:
        pass
    return body.decode("utf-8", "replace").strip()[:300] or "(empty body)"


def _hung(replica: Replica, phase: str) -> ClientApiError:
    return ClientApiError(
        502, f"Replica {replica.id} stopped answering and was withdrawn as hung (phase: {phase}).", code=HUNG
    )


# The error code (and the outcome's reason) of an attempt cut short because its replica was found hung.
HUNG = "upstream_hung"


def _reason(error: ClientApiError, otherwise: str) -> str:
    return "hung" if error.code == HUNG else otherwise


async def exchange_with(
    upstream: UpstreamClient,
    config: GatewayConfig,
    replica: Replica,
    url: str,
    headers: list[tuple[str, str]],
    request: ParsedRequest,
    exchange: Exchange,
    record: StreamRecord | None = None,
    engine_slot: int | None = None,
) -> Outcome:
    """Send ``request`` to ``replica``, relay its answer into ``exchange``, and say how it went.

    With an ``engine_slot`` the request names that llama-server slot (gateway/engine_slots.py),
    in place of any ``id_slot`` the client sent.

    When the record holds a splice, this attempt continues a stream already under way. A stream
    that breaks after bytes reached the client is ``Broken`` whether or not it may be continued:
    the gateway either continues it or ends it with the error.
    """
    body = request.body
    renamed = bool(replica.served_name) and replica.served_name != request.model
    # The LoRA adapter the client's model name means, and no other (gateway/adapters.py).
    adapter = adapter_fields(replica, request.model, request.payload)
    if renamed or engine_slot is not None or adapter is not None:
        payload = dict(request.payload)
        if renamed:
            # Engines such as vLLM check the name; llama-server ignores it (then it is not set).
            payload["model"] = replica.served_name
        if adapter is not None:
            payload.pop("lora", None)
            payload.update(adapter)
        if engine_slot is not None:
            payload["id_slot"] = engine_slot
        body = json.dumps(payload).encode()
    waited = time.perf_counter()
    answered = False
    progress = replica.progress
    outcome: Outcome = ANSWERED
    try:
        # One scope for the wait for the response head, lifted once it is in: a second
        # scope (or an exit stack to nest one) per request is measurable on this path.
        with trio.CancelScope(deadline=trio.current_time() + config.first_byte_timeout) as head:
            progress.wait(head)
            async with upstream.open(
                "POST", url, headers=headers, body=body, connect_timeout=config.connect_timeout
            ) as response:
                # No longer cancellable as a wait on a hung engine: the relay's own scopes are.
                progress.answered(head)
                head.deadline = math.inf
                answered = True
                exchange.upstream_seconds += time.perf_counter() - waited
                outcome = await _relay(
                    config,
                    replica,
                    response,
                    exchange,
                    record,
                    usage_bounds(request, context=replica.facts.context_length if replica.facts is not None else None),
                )
    finally:
        progress.done(head)
        if not answered:
            exchange.upstream_seconds += time.perf_counter() - waited
    if head.cancelled_caught:
        if progress.hung_since is not None:
            # Nothing reached the client: another replica serves it at once.
            return Retry(_hung(replica, "first_byte"), "hung")
        return Stalled(
            ClientApiError(
                504,
                f"Replica {replica.id} did not answer within {config.first_byte_timeout:g} s (phase: first_byte).",
                code="upstream_timeout",
            )
        )
    return outcome


def is_refusal(status: int) -> bool:
    """An engine's answer that the request, not the engine, is at fault: a 4xx, or 501 (llama-server
    answers a route its model does not serve, /v1/embeddings on a chat model, with 501). The 401
    and 403 are not among them: those say the engine refused the gateway's own key, a replica
    that is misconfigured, and no client's mistake (they are retried on another replica)."""
    return (400 <= status < 500 and status not in (401, 403)) or status == 501


def refusal_answer(status: int, body: bytes, api: str) -> tuple[int, bytes]:
    """The client's answer (status, body) for an engine's refusal, whatever the engine sent: a 4xx
    (501 becomes 400). The engine's body goes as it is when it is already an error in the route's
    API shape; anything else is answered in that shape with the engine's message."""
    answer = 400 if status == 501 else status
    try:
        value = json_loads(body)
    except ValueError:
        value = None
    if isinstance(value, dict) and _in_shape(value, api):
        return answer, body
    code = "unsupported_by_model" if status == 501 else "engine_rejected"
    error = ClientApiError(
        answer, f"The model's engine refused the request ({status}): {engine_message(body)}", code=code
    )
    return answer, error.in_shape(api)


def _in_shape(value: dict[str, object], api: str) -> bool:
    error = value.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return False
    if api == "anthropic":
        return value.get("type") == "error" and isinstance(error.get("type"), str)
    return True


async def _error_body(config: GatewayConfig, replica: Replica, response: UpstreamResponse, exchange: Exchange) -> bytes:
    """An engine's error answer, bounded; the read's own failure, as text, when it broke off."""
    try:
        return (await _read_all(config, replica, response, exchange, _ERROR_BODY_LIMIT))[:_ERROR_BODY_LIMIT]
    except ClientApiError as error:
        return error.message.encode()


async def _read_all(
    config: GatewayConfig, replica: Replica, response: UpstreamResponse, exchange: Exchange, limit: int | None = None
) -> bytes:
    """The whole body; ClientApiError when the engine stalls for the idle timeout or breaks off."""
    idle = config.idle_timeout
    parts = []
    size = 0
    waited = time.perf_counter()
    progress = replica.progress
    try:
        with trio.CancelScope(deadline=trio.current_time() + idle) as stalled:
            progress.wait(stalled)
            while (chunk := await response.next_chunk()) is not None:
                parts.append(chunk)
                size += len(chunk)
                if limit is not None and size >= limit:
                    break
                progress.last = now = trio.current_time()
                stalled.deadline = now + idle
    except UpstreamBodyError as exc:
        raise ClientApiError(
            502, f"Replica {replica.id} broke off its response (phase: body): {exc}", code="upstream_broken"
        ) from None
    finally:
        progress.done(stalled)
        exchange.upstream_seconds += time.perf_counter() - waited
    if stalled.cancelled_caught:
        if replica.progress.hung_since is not None:
            raise _hung(replica, "body")
        raise ClientApiError(
            504, f"Replica {replica.id} sent nothing for {idle:g} s (phase: body).", code="upstream_timeout"
        )
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _relay(
    config: GatewayConfig,
    replica: Replica,
    response: UpstreamResponse,
    exchange: Exchange,
    record: StreamRecord | None,
    bounds: UsageBounds,
) -> Outcome:
    status = response.status_code
    if (status >= 500 or status in (401, 403)) and not is_refusal(status):
        # A 401 or 403 is the engine refusing the gateway's own key: that replica is misconfigured,
        # as unwell as a 5xx for the client, whose own key was fine.
        detail = engine_message(await _error_body(config, replica, response, exchange))
        return Retry(
            ClientApiError(
                502, f"Replica {replica.id} answered {status} (phase: first_byte): {detail}", code="upstream_error"
            ),
            f"http_{status}",
        )
    content_type = response.content_type()
    if is_refusal(status) or (
        record is not None
        and record.splice is not None
        and (status >= 300 or not content_type.startswith("text/event-stream"))
    ):
        # The request's own fault (or, continuing a stream, an answer that cannot be spliced in):
        # another replica would answer the same.
        return Refused(status, await _error_body(config, replica, response, exchange))
    splice = record.splice if record is not None else None
    if not content_type.startswith("text/event-stream"):
        try:
            body = await _read_all(config, replica, response, exchange)
        except ClientApiError as error:
            # Nothing has reached the client yet, so another replica may still serve it.
            return Retry(error, _reason(error, "body"))
        if status < 300:
            exchange.usage = find_usage(body, bounds)
        await exchange.respond(status, body, content_type.encode() or b"application/json")
        return ANSWERED
    if splice is None:
        await exchange.start_stream(status, content_type.encode())
        # From here the overhead figure is fixed: the relay's own time overlaps the engine's.
        exchange.freeze_overhead()
    tail = StreamTail(bounds, head=exchange.stream_format == "anthropic")
    ended = False
    arrived, collected = trio.open_memory_channel[bytes | ClientApiError | None](_RELAY_QUEUE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_read_stream, config, replica, response, arrived)
        failure: ClientApiError | None = None
        done = False
        while not done:
            # Everything the reader has queued goes out as one write: under load that turns
            # dozens of small SSE events into one send, which is most of a stream's CPU.
            parts: list[bytes] = []
            item = await collected.receive()
            while True:
                if item is None or isinstance(item, ClientApiError):
                    done, failure = True, item
                    break
                parts.append(item)
                try:
                    item = collected.receive_nowait()
                except trio.WouldBlock:
                    break
            if parts or (done and record is not None):
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                if record is not None:
                    # Only whole events leave, so a cut never leaves half of one at the client.
                    clean = done and failure is None
                    if splice is not None:
                        data = splice.feed(data) + (splice.rest() if clean else b"")
                    data = record.whole_events(data)
                    ended = ended or b"data: [DONE]" in data
                    if clean and ended:
                        data += record.rest()
                    elif clean:
                        failure = ClientApiError(
                            502,
                            f"Replica {replica.id} ended its stream without [DONE] (phase: body).",
                            code="upstream_broken",
                        )
                    if not data:
                        continue
                tail.feed(data)
                if b'"usage"' in data:
                    # Taken now: a client that closes right after [DONE] cancels what follows.
                    exchange.usage = tail.usage() or exchange.usage
                    if splice is not None and splice.charged is not None:
                        exchange.usage = splice.charged
                if (done and failure is None) or b"data: [DONE]" in data:
                    # This write carries the end of the answer: a client that hangs up from
                    # here on (the openai client does, right after [DONE]) is done, not gone.
                    exchange.complete = True
                await exchange.send_chunk(data, events=data.count(b"data:"))
    exchange.usage = tail.usage() or exchange.usage
    if splice is not None and splice.charged is not None:
        exchange.usage = splice.charged
    if failure is not None:
        # Bytes already reached the client: another replica may continue it, or the error travels
        # as the last event. The gateway decides, and ends the stream.
        return Broken(failure, _reason(failure, failure.code or "broken"))
    await exchange.end_stream()
    return ANSWERED


async def _read_stream(
    config: GatewayConfig,
    replica: Replica,
    response: UpstreamResponse,
    arrived: trio.MemorySendChannel[bytes | ClientApiError | None],
) -> None:
    """Read the engine's stream into the relay queue; ends with None, or the error that ended it."""
    idle = config.idle_timeout
    # Moving a cancel scope's deadline goes through trio's deadline heap: done twice per chunk
    # it was measurable in a stream's CPU (docs/performance.md). The deadline is moved at most every ``slack``
    # seconds instead, and set ``slack`` later than due, so it fires between ``idle`` and
    # ``idle + slack`` after the last chunk: never early.
    slack = min(1.0, idle / 10)
    progress = replica.progress
    async with arrived:
        # Waiting on a full queue (a slow client) is not idleness: the deadline is lifted then.
        with trio.CancelScope(deadline=trio.current_time() + idle + slack) as waiting:
            progress.wait(waiting)
            refresh_at = trio.current_time() + slack
            try:
                while (chunk := await response.next_chunk()) is not None:
                    try:
                        arrived.send_nowait(chunk)
                    except trio.WouldBlock:
                        waiting.deadline = math.inf
                        await arrived.send(chunk)
                        refresh_at = 0.0
                    # Every chunk is the engine's sign of life (gateway/hang_watch.py).
                    progress.last = now = trio.current_time()
                    if now >= refresh_at:
                        waiting.deadline = now + idle + slack
                        refresh_at = now + slack
            except UpstreamBodyError as exc:
                await arrived.send(
                    ClientApiError(
                        502, f"Replica {replica.id} broke off its response (phase: body): {exc}", code="upstream_broken"
                    )
                )
                return
            finally:
                progress.done(waiting)
        if waiting.cancelled_caught and progress.hung_since is not None:
            await arrived.send(_hung(replica, "body"))
            return
        if waiting.cancelled_caught:
            await arrived.send(
                ClientApiError(
                    504, f"Replica {replica.id} sent nothing for {idle:g} s (phase: body).", code="upstream_timeout"
                )
            )
            return
        await arrived.send(None)
