"""The OpenAI endpoints as a plain ASGI application.

The data path is written against ASGI directly rather than through Quart's response objects:
a Quart streaming body runs after the handler has returned, outside the scope that opened the
upstream request, so a client that disconnects before the first body iteration leaves the
upstream request open. Here one function owns the whole exchange -- read, pick, connect, relay --
inside one nursery, and the upstream response is an ``async with`` that closes the moment the
client goes away. It also saves Quart's own cost per request (docs/performance.md). The admin API and
pages, which are not hot, use Quart.

About 640 lines: the dispatch of every route and the two attempt loops (first attempts and
continuations) that follow the one policy table in ``attempts.py``; the parsing, relay, usage and
hang watch are modules of their own.
"""

from __future__ import annotations

import os
import time
from typing import Any

import trio

from llmgw_shared import tracing
from llmgw_shared.logs import get_logger, request_context

from ..api_errors import ClientApiError, model_not_found
from ..catalog.profile_key import ProfileKey
from ..priority import Priority
from ..tenancy.admission import Admission, Ticket, admit_waiting
from ..transport.asgi import REQUEST_ID, Receive, Scope, Send
from .activator import Activator, Refusal, Slot
from .adapters import adapter_affinity, without_adapter
from .affinity import Affinity, request_affinity
from .attempts import Broken, Outcome, Phase, Refused, Retry, Stalled, Step, policy
from .capabilities import PROBE_CONCURRENCY, ModelCapabilities, combine, declared, learn, needs, refusal
from .config import GatewayConfig
from .continuation import StreamRecord, continuation_request, ending, may_continue
from .cors import CorsPolicy
from .directory import ModelDirectory, StaticDirectory
from .engine_slots import claim_engine_slot, give_back_engine_slot
from .exchange import Exchange, header, record, request_id
from .hang_watch import HangWatch
from .metrics import GatewayMetrics
from .relay import engine_message, exchange_with, refusal_answer
from .replicas import Replica, ReplicaSet
from .requests import ENDPOINTS, ClientGone, ParsedRequest, parse_request, read_body
from .tracing import begin
from .upstream import UpstreamClient, UpstreamClosedEarly, UpstreamError

log = get_logger(__name__)


class Gateway:
    def __init__(
        self,
        replicas: ReplicaSet,
        upstream: UpstreamClient,
        metrics: GatewayMetrics,
        config: GatewayConfig,
        *,
        directory: ModelDirectory | None = None,
        activator: Activator | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.replicas = replicas
        self.upstream = upstream
        self.metrics = metrics
        self.config = config
        self.directory = directory or StaticDirectory(replicas)
        # Gateway-only mode has no reconciler to start replicas, but its static replicas' slots are
        # admitted the same way; the live window shows its queues (app.py hands both one ``WaitingRequests``).
        self.activator = activator or Activator(replicas, demand=metrics.live.queues)
        self.admission = admission
        self.cors = CorsPolicy.of(config.allowed_origins)
        # The ``created`` of a model no engine has dated: when this daemon started serving it.
        self.started = int(time.time())
        # Engines asked what they serve at once (gateway/capabilities.py), by this gateway.
        self.probes = trio.CapacityLimiter(PROBE_CONCURRENCY)
        # Finds hung engines and moves their requests; its ``run`` is the daemon's task (app.py).
        self.hangs = HangWatch(replicas, upstream, config, metrics)
        # The daemon's tracing (llmgw_shared/tracing.py): OFF, a boolean per request, without a collector.
        self.tracing = tracing.current()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(send, request_id(scope))
        with request_context(exchange.request_id):
            try:
                await self._dispatch(scope, receive, exchange)
            except ClientApiError as error:
                await exchange.send_error(error)
            except ClientGone:
                exchange.client_gone = True
            except Exception:
                log.exception("unexpected error while serving %s %s", scope["method"], scope["path"])
                if not exchange.response_started:
                    await exchange.send_error(
                        ClientApiError(
                            500,
                            f"Internal error in the gateway (request id {exchange.request_id}).",
                            code="internal_error",
                        )
                    )
            finally:
                record(scope, exchange, self.metrics)
                exchange.trace.end(exchange)

    async def _dispatch(self, scope: Scope, receive: Receive, exchange: Exchange) -> None:
        # For the server's own log line should the connection fail while this request is served.
        scope[REQUEST_ID] = exchange.request_id
        path: str = scope["path"]
        method: str = scope["method"]
        if self.cors.origins:
            exchange.cors = self.cors.headers(header(scope, b"origin"))
        if method == "OPTIONS":
            await self._options(scope, exchange)
            return
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None:
            exchange.api, exchange.kind = endpoint.api, endpoint.kind
            if self.tracing.enabled:
                exchange.trace = begin(
                    self.tracing,
                    header(scope, b"traceparent"),
                    header(scope, b"tracestate"),
                    path,
                    endpoint.kind,
                    endpoint.api,
                    exchange.request_id,
                )
            if method != "POST":
                raise ClientApiError(
                    405, f"Method {method} is not allowed on {path}; use POST.", code="method_not_allowed"
                )
            authorization = _authorization(scope, endpoint.api)
            # Who is asking comes first, on the head: a client without a key gets its 401 before
            # its body is invited (no 100 Continue) or read, and learns no model names.
            allowed = self.admission.authenticate(authorization) if self.admission is not None else None
            length = header(scope, b"content-length")
            body = await read_body(
                receive,
                content_length=int(length) if length and length.isdigit() else None,
                limit=self.config.max_body_bytes,
            )
            request = parse_request(endpoint, body)
            profile_key = self.directory.resolve(request.model)
            if profile_key is None:
                raise model_not_found(request.model, self._visible(allowed), restricted=allowed is not None)
            # An adapter is counted under its own name (metrics, usage, quotas), served by its base.
            adapter = self.directory.adapter(request.model)
            exchange.model = adapter or profile_key
            exchange.trace.requested(request, profile_key)
            exchange.stream = request.stream
            if request.stream:
                exchange.stream_format = endpoint.stream_format
            affinity = adapter_affinity(self._affinity(profile_key, request, scope), adapter)
            wanted = needs(request)
            if len(wanted) > 1:
                # A feature (vision, audio) only the engines can say they have.
                await learn(self.upstream, self.replicas.for_model(profile_key), self.probes)
            if self.admission is None:
                self._check_capabilities(profile_key, request, wanted)
                await self._forward(request, profile_key, receive, exchange, affinity=affinity, adapter=adapter)
                return
            estimate = _estimate_tokens(request)
            with exchange.trace.phase("llmgw.admission"):
                ticket = await admit_waiting(
                    self.admission,
                    authorization,
                    adapter or ProfileKey.model_of(profile_key),
                    estimated_tokens=sum(estimate),
                )
            try:
                # After the allow-list (a key learns nothing of a model it may not use), before
                # any replica: a request the model cannot serve is the caller's 400.
                self._check_capabilities(profile_key, request, wanted)
                await self._forward(
                    request, profile_key, receive, exchange, ticket.priority, affinity=affinity, adapter=adapter
                )
            finally:
                _settle(ticket, exchange, estimate, request.endpoint.metered)
        elif path.startswith("/v1/models") and method == "GET":
            # x-api-key too: the anthropic SDK lists models with it.
            allowed = self.admission.authenticate(_authorization(scope, "anthropic")) if self.admission else None
            await self._models(path, exchange, allowed)
        elif path == "/healthz":
            # The pid says which worker answered, when several share the port (workers = N).
            await exchange.respond_json(200, {"status": "ok", "replicas": len(self.replicas), "pid": os.getpid()})
        else:
            raise ClientApiError(404, f"Unknown request URL: {method} {path}.", code="unknown_url")

    async def _options(self, scope: Scope, exchange: Exchange) -> None:
        """A CORS preflight (gateway/cors.py): 204 for an allowed origin, 403 for another; a plain
        OPTIONS (no Origin) learns the methods."""
        origin = header(scope, b"origin")
        if origin is None:
            await exchange.respond_empty(204, [(b"allow", b"GET, POST, OPTIONS")])
        elif self.cors.allows(origin):
            exchange.cors = []
            asked = header(scope, b"access-control-request-headers")
            await exchange.respond_empty(204, self.cors.preflight(origin, asked))
        else:
            raise ClientApiError(
                403,
                f"Origin {origin[:200]!r} may not call this API from a browser (router.allowed_origins).",
                code="origin_not_allowed",
            )

    def capabilities(self, profile_key: str) -> ModelCapabilities | None:
        """What the model behind ``profile_key`` serves, as far as is known (gateway/capabilities.py)."""
        profile = self.directory.profile(profile_key)
        facts = [r.facts for r in self.replicas.for_model(profile_key) if r.facts is not None]
        if profile is None and not facts:
            return None
        return combine(
            bool(profile and profile.capabilities), declared(profile), facts, profile.context if profile else None
        )

    def _check_capabilities(self, profile_key: str, request: ParsedRequest, wanted: list[str]) -> None:
        refused = refusal(request.model, self.capabilities(profile_key), wanted)
        if refused is not None:
            raise refused

    def _affinity(self, profile_key: str, request: ParsedRequest, scope: Scope) -> Affinity | None:
        """The request's replica preference under prefix routing; None under least-loaded."""
        if (self.directory.routing(profile_key) or self.config.routing) != "prefix":
            return None
        return request_affinity(request, header(scope, b"x-session-id"), self.config.affinity_load_factor)

    async def _models(self, path: str, exchange: Exchange, allowed: frozenset[str] | None) -> None:
        visible = self._visible(allowed)
        profile_keys = {self.directory.resolve(name) for name in visible}
        await learn(
            self.upstream,
            [
                r
                for profile_key in profile_keys
                if profile_key is not None
                for r in self.replicas.for_model(profile_key)
            ],
            self.probes,
        )
        if path == "/v1/models":
            await exchange.respond_json(200, {"object": "list", "data": [self._model_card(m) for m in visible]})
            return
        name = path.removeprefix("/v1/models/")
        if not self._may_see(name, allowed):
            raise model_not_found(name, visible, restricted=allowed is not None)
        await exchange.respond_json(200, self._model_card(name))

    def _model_card(self, name: str) -> dict[str, Any]:
        """A model as /v1/models lists it, with what clients read to size and route requests:
        ``context_length`` (OpenRouter, LiteLLM) and ``max_model_len`` (vLLM's name), the
        capabilities, and ``created`` (its engine's, else this daemon's start)."""
        profile_key = self.directory.resolve(name)
        capabilities = self.capabilities(profile_key) if profile_key is not None else None
        card: dict[str, Any] = {
            "id": name,
            "object": "model",
            "owned_by": "llmgw",
            "created": (capabilities.created if capabilities else None) or self.started,
        }
        if capabilities is not None:
            card["capabilities"] = capabilities.listed()
            if capabilities.context_length:
                card["context_length"] = card["max_model_len"] = capabilities.context_length
        return card

    def _may_see(self, name: str, allowed: frozenset[str] | None) -> bool:
        profile_key = self.directory.resolve(name)
        # As ``admit`` checks an allow-list: by the model, whatever the profile; an adapter by its own name.
        return profile_key is not None and (
            allowed is None or (self.directory.adapter(name) or ProfileKey.model_of(profile_key)) in allowed
        )

    def _visible(self, allowed: frozenset[str] | None) -> list[str]:
        """The model names a key may see: all of them, or those its allow-list names."""
        names = self.directory.names()
        return names if allowed is None else [name for name in names if self._may_see(name, allowed)]

    async def _forward(
        self,
        request: ParsedRequest,
        profile_key: str,
        receive: Receive,
        exchange: Exchange,
        priority: Priority = Priority.INTERACTIVE,
        *,
        affinity: Affinity | None = None,
        adapter: str | None = None,
    ) -> None:
        in_flight = self.metrics.in_flight.labels(profile_key)
        in_flight.inc()
        failure: Exception | None = None
        try:
            async with trio.open_nursery() as nursery:
                # Inside the nursery, so a client that gives up stops waiting for a slot too.
                nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope, exchange)
                try:
                    await self._attempts(request, profile_key, exchange, priority, affinity, adapter)
                except Exception as exc:
                    # Re-raised below the nursery, so callers see the error itself rather than
                    # an exception group wrapping it.
                    failure = exc
                nursery.cancel_scope.cancel()
        finally:
            in_flight.dec()
        if failure is not None:
            raise failure

    def _stream_record(self, request: ParsedRequest, profile_key: str) -> StreamRecord | None:
        """A record of the stream when it may be continued elsewhere should its engine break off."""
        config = self.config
        allowed = config.continue_streams.get(
            profile_key, config.continue_streams.get(ProfileKey.model_of(profile_key), True)
        )
        if config.max_continuations < 1 or not allowed or not may_continue(request):
            return None
        return StreamRecord(request)

    async def _attempts(
        self,
        request: ParsedRequest,
        profile_key: str,
        exchange: Exchange,
        priority: Priority,
        affinity: Affinity | None,
        adapter: str | None = None,
    ) -> None:
        """Up to ``max_attempts`` attempts on replicas not tried yet, each outcome stepped through
        the policy table (gateway/attempts.py). An adapter's request counts the replicas that do
        not hold it as tried: it never reaches them."""
        activator = self.activator
        tried = without_adapter(self.replicas.for_model(profile_key), adapter)
        failure: ClientApiError | None = None
        record = self._stream_record(request, profile_key)
        for attempt in range(self.config.max_attempts):
            slot = activator.try_acquire(profile_key, tried, affinity)
            if slot is None:
                waited = await self._queue(profile_key, exchange, priority, tried, affinity, retry=bool(attempt))
                if waited is Refusal.EXHAUSTED:
                    break
                if isinstance(waited, Refusal):
                    raise activator.refusal_error(waited, profile_key)
                slot = waited
            with slot:
                replica = slot.replica
                if attempt:
                    self.metrics.retries.labels(replica.id, "other_replica").inc()
                elif slot.affinity is not None:
                    # The first choice only: a retry avoids the replica that failed on purpose.
                    # A new conversation went where its policy sends it (the least loaded
                    # replica): a hit, and counted apart as well.
                    self.metrics.affinity.labels(profile_key, "miss" if slot.affinity == "miss" else "hit").inc()
                    if slot.affinity == "new":
                        self.metrics.affinity_new.labels(profile_key).inc()
                tried = tried | {replica.id}
                exchange.replica = replica.id
                outcome = await self._attempt(replica, request, exchange, record, affinity)
            step = self._step(replica, profile_key, outcome, Phase.ATTEMPT)
            if step is Step.DONE:
                return
            if step is Step.ANSWER:
                await self._answer(outcome, exchange)
                return
            if step is Step.CONTINUE:
                assert isinstance(outcome, Broken)
                await self._continue(profile_key, exchange, priority, tried, outcome, record, affinity)
                return
            assert isinstance(outcome, Retry)  # Step.NEXT
            failure = outcome.error
        raise failure or ClientApiError(
            503, f"No replica of model '{request.model}' is available.", code="no_replica_available"
        )

    def _step(self, replica: Replica, profile_key: str, outcome: Outcome, phase: Phase) -> Step:
        """The policy's step for ``outcome``, with the replica cooled down when the policy says so."""
        rule = policy(outcome, phase)
        if rule.cool_down:
            assert isinstance(outcome, (Retry, Broken))
            self._failed(replica, profile_key, outcome.reason, outcome.error)
        return rule.step

    async def _answer(self, outcome: Outcome, exchange: Exchange) -> None:
        """Step.ANSWER: the client's answer from the outcome itself."""
        if isinstance(outcome, Refused):
            status, answer = refusal_answer(outcome.status, outcome.body, exchange.api)
            # x-should-retry: the SDKs would otherwise retry some 4xx (408, 409, 429) with the same mistake.
            await exchange.respond(status, answer, extra=[(b"x-should-retry", b"false")])
            return
        assert isinstance(outcome, Stalled)
        raise outcome.error

    def _failed(self, replica: Replica, profile_key: str, reason: str, error: ClientApiError) -> None:
        if replica.progress.hung_since is None:
            # A hung replica is out of rotation already, until its /health answers (gateway/hang_watch.py).
            replica.cooldown_until = max(replica.cooldown_until, trio.current_time() + self.config.cooldown)
            self.metrics.cooldowns.labels(replica.id).inc()
        log.warning(
            "replica %s failed (%s): %s",
            replica.id,
            reason,
            error.message,
            extra={"replica": replica.id, "model": profile_key},
        )

    async def _continue(
        self,
        profile_key: str,
        exchange: Exchange,
        priority: Priority,
        tried: frozenset[str],
        broken: Broken,
        record: StreamRecord | None,
        affinity: Affinity | None,
    ) -> None:
        """Continue a broken stream on other replicas, at most ``max_continuations`` times.

        Each try asks for another ready replica (not one tried already) with what the client has
        received so far; when none can, the stream ends with the last failure as its error event,
        as a stream that may not be continued (no ``record``) does at once.
        """
        if record is None:
            log.warning(
                "stream from replica %s ended early: %s",
                exchange.replica,
                broken.error.message,
                extra={"replica": exchange.replica, "model": profile_key},
            )
            await exchange.send_error(broken.error)
            await exchange.end_stream()
            return
        failure, ended = broken.error, "gave_up"
        for _ in range(self.config.max_continuations):
            if exchange.client_gone:
                return  # never for a client that hung up (its cancellation is on the way)
            seen = record.seen()
            end = ending(record.request, seen)
            if end is not None:
                # The answer was whole but for its last events: those need no engine.
                self.metrics.continuations.labels(profile_key, "finished").inc()
                exchange.complete = True
                await exchange.send_chunk(end, events=end.count(b"data:"))
                await exchange.end_stream()
                return
            plan = None if record.overflow or seen.other else continuation_request(record.request, seen)
            if plan is None:
                ended = "impossible"
                break
            # By the affinity's order too: the replica that continues is the one its next turns prefer
            # while the broken one stays out, so it is worth warming.
            slot = self.activator.try_acquire(profile_key, tried, affinity)
            if slot is None:
                waited = await self._queue(profile_key, exchange, priority, tried, affinity, retry=True)
                if isinstance(waited, Refusal):
                    break
                slot = waited
            with slot:
                replica = slot.replica
                tried = tried | {replica.id}
                exchange.replica = replica.id
                record.continue_after(seen)
                exchange.continuations = record.continuations
                outcome = await self._attempt(replica, plan, exchange, record, affinity)
            step = self._step(replica, profile_key, outcome, Phase.CONTINUATION)
            if step is Step.DONE:
                self.metrics.continuations.labels(profile_key, "continued").inc()
                return
            if isinstance(outcome, Retry):
                # Nothing of it reached the client; the next try starts from the same place.
                record.broken_tokens.pop()
            if step is Step.END_STREAM:
                if isinstance(outcome, Refused):
                    failure, ended = (
                        ClientApiError(
                            502,
                            f"Replica {replica.id} would not continue the stream ({outcome.status}): "
                            f"{engine_message(outcome.body)}",
                            code="upstream_error",
                        ),
                        "refused",
                    )
                else:
                    assert isinstance(outcome, Stalled)
                    failure = outcome.error
                break
            assert isinstance(outcome, (Retry, Broken))  # Step.NEXT, Step.CONTINUE: another try
            failure = outcome.error
        self.metrics.continuations.labels(profile_key, ended).inc()
        log.warning(
            "stream ended early after %d continuation(s) (%s): %s",
            record.continuations,
            ended,
            failure.message,
            extra={"model": profile_key},
        )
        await exchange.send_error(failure)
        await exchange.end_stream()

    async def _queue(
        self,
        profile_key: str,
        exchange: Exchange,
        priority: Priority,
        tried: frozenset[str],
        affinity: Affinity | None,
        *,
        retry: bool,
    ) -> Slot | Refusal:
        """Wait for a slot; the time waited is the queue's, neither llmgw's work nor the engine's."""
        held = time.perf_counter()
        outcome: Slot | Refusal | None = None
        try:
            with exchange.trace.phase("llmgw.queue") as span:
                outcome = await self.activator.wait(
                    profile_key, priority, exclude=tried, front=retry, affinity=affinity
                )
                span.set_attribute("llmgw.queue_outcome", "slot" if isinstance(outcome, Slot) else outcome.value)
        finally:
            # Refused at once (queue full, nothing left to try): that request never waited.
            if outcome is not Refusal.OVERFLOW and outcome is not Refusal.EXHAUSTED:
                waited = time.perf_counter() - held
                exchange.queued_seconds += waited
                self.metrics.queue_wait.labels(profile_key).observe(waited)
        if isinstance(outcome, Refusal) and outcome is not Refusal.EXHAUSTED:
            self.metrics.queue_refusals.labels(profile_key, outcome.value).inc()
        return outcome

    async def _attempt(
        self,
        replica: Replica,
        request: ParsedRequest,
        exchange: Exchange,
        record: StreamRecord | None = None,
        affinity: Affinity | None = None,
    ) -> Outcome:
        headers = [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("x-request-id", exchange.request_id),
        ]
        # Before the engine's key is added: the span's traceparent is all the trace adds.
        span = exchange.trace.attempt(replica.id, exchange.continuations, headers)
        if replica.api_key:
            headers.append(("authorization", f"Bearer {replica.api_key}"))
        url = replica.url + request.endpoint.path
        gauge = self.metrics.replica_in_flight.labels(replica.id)
        gauge.inc()
        engine_slot = claim_engine_slot(replica, affinity.id) if affinity is not None else None
        outcome: Outcome | None = None
        try:
            outcome = await exchange_with(
                self.upstream, self.config, replica, url, headers, request, exchange, record, engine_slot
            )
        except UpstreamClosedEarly as exc:
            # A fresh connection (the upstream client re-sends once when a pooled one was closed
            # under the request) closed before answering: the engine is in trouble.
            outcome = Retry(
                ClientApiError(
                    502,
                    f"Replica {replica.id} closed the connection before answering (phase: first_byte): {exc}",
                    code="upstream_closed",
                ),
                "closed",
            )
        except UpstreamError as exc:
            # A connect error, or anything else the upstream client could not send.
            outcome = Retry(
                ClientApiError(
                    502,
                    f"Replica {replica.id} could not be reached (phase: connect): {exc}",
                    code="upstream_connect_error",
                ),
                "connect",
            )
        finally:
            give_back_engine_slot(replica, engine_slot)
            gauge.dec()
            exchange.trace.attempted(span, outcome)
        return outcome


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope, exchange: Exchange) -> None:
    """Cancel the exchange when the client goes away, which closes the upstream request at once."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not exchange.complete:
                exchange.client_gone = True
                scope.cancel()
            return


# Completion tokens reserved against a quota for a request that names no max_tokens: settled with
# the engine's real count afterwards, so this only decides whether a request near its limit is
# let in; 512 is a long chat answer, and a shorter default would admit requests that then overrun.
_DEFAULT_COMPLETION_ESTIMATE = 512


def _authorization(scope: Scope, api: str) -> str | None:
    """The client's key as an Authorization value: ``Authorization: Bearer``, or on the Anthropic
    routes ``x-api-key`` (the anthropic SDK's default; Claude Code sends either)."""
    authorization = header(scope, b"authorization")
    if authorization is None and api == "anthropic":
        api_key = header(scope, b"x-api-key")
        if api_key is not None:
            return f"Bearer {api_key}"
    return authorization


def _estimate_tokens(request: ParsedRequest) -> tuple[int, int]:
    """(prompt, completion) tokens to reserve before the engine says: ~4 bytes a token, the
    request's output budget (max_tokens, max_output_tokens...), none for routes that generate none."""
    fields = request.endpoint.max_output
    if not request.endpoint.metered:
        return 0, 0
    if not fields:
        return len(request.body) // 4, 0
    budgets = (request.payload.get(name) for name in fields)
    completion = next(
        (b for b in budgets if isinstance(b, int) and not isinstance(b, bool) and b > 0), _DEFAULT_COMPLETION_ESTIMATE
    )
    return len(request.body) // 4, completion


def _settle(ticket: Ticket, exchange: Exchange, estimate: tuple[int, int], metered: bool = True) -> None:
    """Count what was served: the engine's usage, else an estimate; nothing for a failure."""
    if exchange.usage is not None:
        ticket.settle(exchange.usage.prompt_tokens, exchange.usage.completion_tokens)
    elif not metered and 200 <= exchange.status < 300:
        ticket.settle(0, 0)
    elif exchange.response_started and 200 <= exchange.status < 300:
        # Served, but the engine reported no usage (a stream without include_usage, or one cut
        # off): giving it back would let those tokens escape every quota.
        completion = exchange.chunks_sent if exchange.stream else estimate[1]
        ticket.settle(estimate[0], completion)
    else:
        ticket.give_back()
