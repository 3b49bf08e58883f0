"""The node's connection to control: one WebSocket, reconnected for as long as the daemon runs.

The agent walks the configured control URLs in order (a standby's ``refuse`` may name the
leader, which is tried next), backs off exponentially with jitter when none answers, and once
welcomed runs four tasks over the socket: a reader (commands in, acks out), a writer (the only
task that sends), a heartbeat (liveness plus only what changed since the last one) and a
watchdog. The watchdog matters: a hung control (a stopped process, a cut network) sends no
FIN, so only the missing application-level heartbeats reveal it.

State reports are produced by the NodeService whether or not control is connected; between
connections they are dropped, since the next ``hello`` carries the current state of everything.
"""

from __future__ import annotations

import contextlib
import random
import ssl
from urllib.parse import urlsplit

import attrs
import trio
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection, connect_websocket_url

from llmgw_node.probe import with_time_cleared
from llmgw_node.service import NodeService
from llmgw_shared.facts import HostFacts
from llmgw_shared.logs import get_logger
from llmgw_shared.wire import (
    Ack,
    DrainReplica,
    EngineState,
    EngineStateReport,
    Error,
    GetReplicaLogs,
    Heartbeat,
    Message,
    Refuse,
    RemoveWeights,
    ReplicaState,
    ReplicaStateReport,
    SetAdapters,
    SetEngines,
    StartReplica,
    StopReplica,
    WeightsHeld,
    Welcome,
    WireError,
    decode,
    encode,
)

log = get_logger(__name__)

# The largest frame a node accepts from control: a SetEngines or StartReplica is a few KiB; 16 MiB
# (trio-websocket's default is 1 MiB) leaves room without letting a frame exhaust memory.
MAX_FRAME = 16 << 20
# A session shorter than this that ends twice in a row counts as a failed connect.
QUICK_SESSION_S = 10.0
COMMANDS = (SetEngines, StartReplica, StopReplica, DrainReplica, SetAdapters, RemoveWeights)


class SessionEnded(Exception):
    """Why a connection to control ended (for the log and the reconnect decision)."""


@attrs.define
class AgentTiming:
    connect_timeout: float = 10.0
    # While control is away (a welcomed connection ended), the first connect attempts get this
    # long, doubling per failure up to connect_timeout: a connect that lands in a dying control's
    # accept queue is never answered, and waiting out 10 s there delays the return to a
    # restarted control by as much. A control that is up answers a connect in milliseconds.
    reconnect_timeout: float = 1.0
    # The first frame back after our hello.
    welcome_timeout: float = 10.0
    # Control counts as gone after this many heartbeat intervals without a frame from it.
    missed_heartbeats: float = 3.0
    # A hung peer never answers our close frame: do not wait long for it before reconnecting.
    disconnect_timeout: float = 1.0


@attrs.define
class AgentStatus:
    """What the agent is doing, for the CLI and tests."""

    connected_to: str = ""
    sessions: int = 0
    last_refusal: str = ""
    last_error: str = ""
    changed: trio.Event = attrs.field(factory=trio.Event)

    def touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


# For this long after control went away (a welcomed connection ended), reconnect attempts come
# at least every RECONNECT_CAP_S: a control restart or a failover is over in seconds, and an
# exponential backoff grown to 8 s by then delays every replica on the node by as much. Past
# the window the backoff grows as usual, so a control that stays down is not hammered.
RECONNECT_WINDOW_S = 30.0
# Within that window the backoff is capped here: a control failover (docs/failover.md) is found
# within a couple of seconds.
RECONNECT_CAP_S = 2.0


def backoff_delay(attempt: int, low: float, high: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": half fixed, half random, so nodes spread out."""
    base: float = min(high, low * 2.0**attempt)
    return base / 2 + rng.uniform(0, base / 2)


def reconnect_delay(attempt: int, away_for: float | None, low: float, high: float, rng: random.Random) -> float:
    """The wait before the next round of attempts; ``away_for``: seconds since control went away
    after a welcomed connection (None when the node has not been welcomed since it started)."""
    if away_for is not None and away_for < RECONNECT_WINDOW_S:
        high = min(high, max(low, RECONNECT_CAP_S))
    return backoff_delay(attempt, low, high, rng)


class Agent:
    def __init__(
        self,
        svc: NodeService,
        *,
        urls: list[str] | None = None,
        timing: AgentTiming | None = None,
        rng: random.Random | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.svc = svc
        self.urls = list(urls if urls is not None else svc.config.control)
        self.timing = timing or AgentTiming()
        self.rng = rng or random.Random()
        self.ssl_context = ssl_context
        self.status = AgentStatus()
        self._outbound: trio.MemorySendChannel[Message] | None = None
        self._sent_engines: dict[tuple[str, str], EngineState] = {}
        self._sent_replicas: dict[str, ReplicaState] = {}
        self._sent_facts: HostFacts | None = None
        self._sent_weights: list[WeightsHeld] = []
        self._seq = 0
        self._redirect = ""
        self._welcomed = False

    async def run(self) -> None:
        if not self.urls:
            raise ValueError("no control URLs configured")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump_reports)
            await self._connect_loop()

    # ------------------------------------------------------------------ reconnecting

    async def _connect_loop(self) -> None:
        cfg = self.svc.config
        attempt = 0
        queue = list(self.urls)
        followed: set[str] = set()
        last_was_quick = False
        # Failed attempts since a welcomed connection ended; None before the first welcome (a
        # node starting up may face a slow link: it gets the full connect timeout).
        away: int | None = None
        lost_at: float | None = None
        while True:
            url = queue.pop(0)
            self._welcomed = False
            started = trio.current_time()
            timeout = self.timing.connect_timeout
            if away is not None:
                timeout = min(timeout, self.timing.reconnect_timeout * 2.0**away)
            try:
                await self._session(url, timeout)
            except SessionEnded as exc:
                self.status.last_error = str(exc)
                log.warning("control %s: %s", url, exc)
            finally:
                self.status.connected_to = ""
                self.status.touch()
            quick = trio.current_time() - started < QUICK_SESSION_S
            away = 0 if self._welcomed else (None if away is None else away + 1)
            if self._welcomed and not (quick and last_was_quick):
                # It worked until it did not: start over from the one that worked, promptly. (Twice
                # in a row welcomed and dropped at once is a failure: back off, do not hammer it.)
                attempt = 0
                lost_at = trio.current_time()
                queue = [url, *[u for u in self.urls if u != url]]
            elif self._redirect and self._redirect not in followed:
                # A standby named the leader: go there now, not after a backoff. Once per round,
                # so two standbys naming each other cannot bounce the node between them.
                followed.add(self._redirect)
                queue = [self._redirect, *[u for u in queue if u != self._redirect]]
            elif self._welcomed:
                queue = []
            self._redirect = ""
            last_was_quick = self._welcomed and quick
            if not queue:
                queue = list(self.urls)
                followed.clear()
                away_for = None if lost_at is None else trio.current_time() - lost_at
                delay = reconnect_delay(attempt, away_for, cfg.reconnect_min_s, cfg.reconnect_max_s, self.rng)
                attempt += 1
                log.info("no control answered; retrying in %.1f s", delay)
                await trio.sleep(delay)

    # ------------------------------------------------------------------ one connection

    async def _session(self, url: str, connect_timeout: float) -> None:
        """Run one connection until it ends; raise SessionEnded saying why.

        The connect (TCP, TLS, WebSocket upgrade) is timed here rather than by trio-websocket's
        ``connect_timeout``: that one raises, but its reader task stays blocked on a socket that
        nobody answers (a dying control's listen backlog) and its nursery waits for it, so the
        timeout did not end the attempt. Here the reader is cancelled with our nursery.
        """
        t = self.timing
        if url.startswith("wss://"):
            await self._check_tls(url, connect_timeout)
        ended: SessionEnded | None = None
        async with trio.open_nursery() as nursery:
            try:
                ws: WebSocketConnection | None = None
                with trio.move_on_after(connect_timeout):
                    ws = await connect_websocket_url(
                        nursery, url, self.ssl_context, message_queue_size=64, max_message_size=MAX_FRAME
                    )
                if ws is None:
                    ended = SessionEnded(f"could not connect: no answer within {connect_timeout:g} s")
                else:
                    try:
                        await self._converse(url, ws)
                    finally:
                        # A hung peer never answers our close frame: bounded, then dropped.
                        with trio.move_on_after(t.disconnect_timeout):
                            await ws.aclose()
            except SessionEnded as exc:
                ended = exc
            except HandshakeError as exc:
                ended = SessionEnded(f"could not connect: {exc}")
            except ConnectionClosed as exc:
                ended = SessionEnded(f"connection closed: {exc.reason}")
            except OSError as exc:
                ended = SessionEnded(f"could not connect: {exc.strerror or exc}")
            nursery.cancel_scope.cancel()
        if ended is not None:
            raise ended

    async def _check_tls(self, url: str, connect_timeout: float) -> None:
        """Handshake once on our own so a certificate problem is reported as itself.

        trio-websocket 0.12 turns a failed TLS handshake into a bare ConnectionTimeout after the
        whole connect timeout, which tells the operator nothing; CERTIFICATE_VERIFY_FAILED does.
        """
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or 443
        context = self.ssl_context or ssl.create_default_context()
        try:
            with trio.fail_after(connect_timeout):
                tcp = await trio.open_tcp_stream(host, port)
                stream = trio.SSLStream(tcp, context, server_hostname=host, https_compatible=True)
                try:
                    await stream.do_handshake()
                finally:
                    await trio.aclose_forcefully(stream)
        except trio.TooSlowError:
            raise SessionEnded(
                f"TLS handshake with {host}:{port} did not finish within {connect_timeout:g} s"
            ) from None
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__ or exc
            raise SessionEnded(f"TLS handshake with {host}:{port} failed: {cause}") from None
        except OSError as exc:
            raise SessionEnded(f"could not connect: {exc.strerror or exc}") from None

    async def _converse(self, url: str, ws: WebSocketConnection) -> None:
        hello = self.svc.hello()
        await ws.send_message(encode(hello))
        try:
            with trio.fail_after(self.timing.welcome_timeout):
                reply = decode(await ws.get_message())
        except trio.TooSlowError:
            raise SessionEnded(f"no answer to hello within {self.timing.welcome_timeout:g} s") from None
        except WireError as exc:
            raise SessionEnded(f"bad answer to hello: {exc}") from None
        if isinstance(reply, Refuse):
            self.status.last_refusal = reply.reason
            log.warning("control %s refused this node: %s", url, reply.reason)
            if reply.leader and reply.leader != url:
                # Try the leader it named next, before the rest of the list (and remember it).
                self.urls = [reply.leader, *[u for u in self.urls if u != reply.leader]]
                self._redirect = reply.leader
                raise SessionEnded(f"refused ({reply.reason}); leader is {reply.leader}")
            raise SessionEnded(f"refused: {reply.reason}")
        if not isinstance(reply, Welcome):
            raise SessionEnded(f"expected welcome or refuse, got {type(reply).__name__}")
        interval = reply.heartbeat_interval_s
        log.info("connected to control %s", url)
        self._sent_engines = {(e.name, e.version): e for e in hello.engines}
        self._sent_replicas = {s.replica_id: s for s in hello.replicas}
        self._sent_facts = with_time_cleared(hello.facts)
        self._sent_weights = hello.weights
        self._welcomed = True
        self.status.connected_to = url
        self.status.sessions += 1
        self.status.touch()
        send, recv = trio.open_memory_channel[Message](1024)
        last_heard = [trio.current_time()]
        try:
            async with trio.open_nursery() as nursery:
                self._outbound = send
                nursery.start_soon(self._writer, ws, recv)
                nursery.start_soon(self._reader, ws, send, last_heard)
                nursery.start_soon(self._heartbeats, send, interval)
                await self._watchdog(last_heard, interval * self.timing.missed_heartbeats)
        except BaseExceptionGroup as group:
            raise _what_ended(group) from None
        finally:
            self._outbound = None

    async def _watchdog(self, last_heard: list[float], limit: float) -> None:
        while True:
            quiet = trio.current_time() - last_heard[0]
            if quiet > limit:
                raise SessionEnded(f"control silent for {quiet:.1f} s (heartbeat missed); reconnecting")
            await trio.sleep(min(limit - quiet, limit / 3) + 0.001)

    async def _writer(self, ws: WebSocketConnection, recv: trio.MemoryReceiveChannel[Message]) -> None:
        async for msg in recv:
            if isinstance(msg, EngineStateReport):
                self._sent_engines[(msg.engine.name, msg.engine.version)] = msg.engine
            elif isinstance(msg, ReplicaStateReport):
                self._sent_replicas[msg.replica.replica_id] = msg.replica
            await ws.send_message(encode(msg))

    async def _reader(
        self, ws: WebSocketConnection, send: trio.MemorySendChannel[Message], last_heard: list[float]
    ) -> None:
        while True:
            frame = await ws.get_message()
            last_heard[0] = trio.current_time()
            try:
                msg = decode(frame)
            except WireError as exc:
                log.warning("bad frame from control: %s", exc)
                await send.send(Error(message=f"bad frame: {exc}"))
                continue
            if isinstance(msg, COMMANDS):
                ack: Ack = await self.svc.handle(msg)
                await send.send(ack)
            elif isinstance(msg, GetReplicaLogs):
                await send.send(await self.svc.replica_logs(msg))
            elif isinstance(msg, Heartbeat):
                pass  # liveness only; last_heard is already updated
            elif isinstance(msg, Error):
                log.warning("control reported an error: %s", msg.message, extra={"in_reply_to": msg.in_reply_to})
            else:
                await send.send(Error(message=f"unexpected message type {type(msg).__name__} from control"))

    async def _heartbeats(self, send: trio.MemorySendChannel[Message], interval: float) -> None:
        while True:
            await trio.sleep(interval)
            await send.send(self._heartbeat())

    def _heartbeat(self) -> Heartbeat:
        """Only what differs from what control was last sent (normally nothing)."""
        self._seq += 1
        engines = [e for e in self.svc.engine_states() if self._sent_engines.get((e.name, e.version)) != e]
        replicas = [s for s in self.svc.replica_states() if self._sent_replicas.get(s.replica_id) != s]
        facts = None
        if with_time_cleared(self.svc.facts) != self._sent_facts:
            facts = self.svc.facts
            self._sent_facts = with_time_cleared(facts)
        for e in engines:
            self._sent_engines[(e.name, e.version)] = e
        for s in replicas:
            self._sent_replicas[s.replica_id] = s
        weights = None
        if self.svc.weights_held != self._sent_weights:
            weights = self._sent_weights = list(self.svc.weights_held)
        return Heartbeat(seq=self._seq, facts=facts, engines=engines, replicas=replicas, weights=weights)

    async def _pump_reports(self) -> None:
        async for report in self.svc.reports:
            out = self._outbound
            if out is None:
                continue
            # A slow socket drops the report: the next heartbeat carries whatever it said.
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                out.send_nowait(report)


def _what_ended(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What to raise when the session's tasks ended with ``group``: SessionEnded saying why, or
    whatever else is in it (a cancellation, a bug), which goes on up.

    Ended and cancelled at once (the node stopping as control dropped it) is the second case,
    with the session's ending taken out: left in, the cancel scope above took the Cancelled out
    of the group and let the ConnectionClosed escape the node as an error.
    """
    matched, rest = group.split((SessionEnded, ConnectionClosed))
    if matched is None:
        return group
    if rest is not None:
        return rest
    first = _leaves(matched)[0]
    if isinstance(first, ConnectionClosed):
        return SessionEnded(f"connection closed: {first.reason}")
    return SessionEnded(str(first))


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
