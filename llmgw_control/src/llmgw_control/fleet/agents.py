"""The agent service: one WebSocket per node at ``/agent/v1``, one task group per connection.

A connection starts with the node's ``hello`` (protocol version, node id, join token, facts,
engines, running replicas) and gets ``welcome`` or ``refuse`` with a reason. After that a reader
applies the node's reports to the inventory, a writer is the only task that sends (commands the
reconciler queued, and control's own heartbeats), and a watchdog closes the connection when the
node has been silent for longer than the unreachable interval: a hung node (stopped process, cut
network) sends no FIN, so only missing heartbeats reveal it.

A malformed frame, an unknown type or a message out of place is answered with an ``error``
frame and logged; it never ends other nodes' connections, and a node that keeps sending garbage
is disconnected after a few in a row.

About 540 lines: one connection's protocol (handshake, reader, writer, watchdog, the accounting
of commands and the log requests that ride the same socket) is one state machine per node, read
top to bottom.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from llmgw_shared import tracing
from llmgw_shared.logs import get_logger
from llmgw_shared.names import BadName, check_node_id
from llmgw_shared.wire import (
    PROTOCOL_VERSION,
    TAGS,
    TRACE_CONTEXT,
    Ack,
    Command,
    EngineSpec,
    EngineStateReport,
    Error,
    GetReplicaLogs,
    Heartbeat,
    Hello,
    Message,
    Refuse,
    ReplicaLogsReply,
    ReplicaStateReport,
    SetEngines,
    StartReplica,
    Welcome,
    WireError,
    decode,
    encode,
)

from ..store.keeper import Role
from .events import NodeEvents
from .inventory import Inventory, NodeRecord

if TYPE_CHECKING:
    from ..store.records import NodeIdentity

log = get_logger(__name__)

# Malformed frames in a row that end a connection: one bad frame is answered with an error frame
# naming the field (a node of another version may send one), five in a row is a node that is not
# speaking the protocol, and reading more from it only costs control.
_MAX_BAD_FRAMES = 5
# Log requests waiting for their node's answer at once, per node: an operator's terminal or two
# following a replica, and the dashboard; more are refused rather than queued without bound.
MAX_LOG_REQUESTS = 16
# How long a node gets to answer a log request: it reads at most 256 KiB of a local file.
LOG_ANSWER_TIMEOUT = 10.0


class LogsUnavailable(Exception):
    """A node cannot be asked for a replica's output now; the text says why."""


class Socket(Protocol):
    async def receive(self) -> str | bytes: ...
    async def send(self, data: str) -> None: ...
    async def close(self, code: int, reason: str = "") -> None: ...


@attrs.frozen
class AgentsConfig:
    # Where nodes connect; empty: no agent service (gateway-only mode).
    listen: str = ""
    # How nodes reach this listener, for the files it serves; empty: http://<listen>.
    public_url: str = ""
    # Digests ("sha256:<hex>") of shared join tokens: a node id that was never onboarded may join
    # with one of these (`llmgw-control join-token` makes a token and prints its digest). A node
    # onboarded with `llmgw-control ctl nodes add` joins with its own token, and with mutual TLS a
    # certificate naming the node is enough.
    join_token_digests: list[str] = attrs.Factory(list)
    # Let any node id join with any token. Off: the fleet is closed by default, since a node that
    # joins is listed, placed on, and sent prompts and engine keys. Only for a lab network where
    # everyone who can reach the agent listener is trusted; control warns at start when it is on.
    open_fleet: bool = False
    # A directory with engines/ and models/ to serve to nodes (air-gapped clusters).
    files_dir: str = ""
    # TLS on the agent listener (wss://, https:// for the files); with a client CA, mutual TLS:
    # every node needs a certificate signed by it, and its node id is taken from it.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    # Control's heartbeat to each node; a node sends its own as often: a hung node (which sends no
    # FIN) is seen within unreachable_after, at a dozen small frames a minute per node.
    heartbeat_interval: float = 5.0
    # A node silent this long takes no new traffic (three missed heartbeats, so one late frame on
    # a busy link is not an outage); silent lost_after, its replicas are placed elsewhere (a
    # minute: long enough for a node daemon's restart, which keeps its engines, to not move them).
    unreachable_after: float = 15.0
    lost_after: float = 60.0
    # The first frame (hello) must arrive this long after the WebSocket opens: a connection that
    # says nothing holds no session; a node sends its hello at once.
    hello_timeout: float = 10.0
    # The largest frame a node may send: a hello of a node with hundreds of replicas and engines is
    # a few tens of KiB; trio-websocket's own default is 1 MiB.
    max_frame_bytes: int = 1024 * 1024
    # Commands queued for one node before it counts as not reading them and is disconnected: a
    # pass sends a handful per node, so a thousand is a node that stopped reading, not a burst.
    command_queue: int = 1000
    # A node acknowledges a command as soon as it reads it (the work goes on in the background),
    # so an ack missing this long means the node is not processing what it is sent: its start
    # commands are failed with that reason and the connection is closed, so that the node's next
    # hello says what it really has. Far beyond a congested link's delay, and below lost_after.
    ack_timeout: float = 30.0


def token_digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


class _Session:
    def __init__(self, node_id: str, queue: int, features: frozenset[str] = frozenset()) -> None:
        self.node_id = node_id
        # Whether the node's hello said it takes a traceparent on its commands (wire.py).
        self.trace_context = TRACE_CONTEXT in features
        self.send_channel, self.receive_channel = trio.open_memory_channel[Command | GetReplicaLogs](queue)
        self.cancel_scope = trio.CancelScope()
        # Commands handed to the socket (or being handed to it) and not acknowledged yet, with
        # when; oldest first (dicts keep insertion order), so the watchdog reads one entry.
        self.pending: dict[str, tuple[Command, float]] = {}
        # The command being handed to the socket: if the connection ends during that send, the
        # command may not have left, and is reported with the ones still queued.
        self.in_hand: Command | GetReplicaLogs | None = None
        # Log requests sent and not answered yet: id -> where the answer goes.
        self.log_requests: dict[str, trio.MemorySendChannel[ReplicaLogsReply]] = {}


class AgentService:
    def __init__(
        self,
        inventory: Inventory,
        *,
        config: AgentsConfig,
        token_digests: set[str],
        engines: Callable[[], list[EngineSpec]],
        events: NodeEvents | None = None,
        role: Role | None = None,
        clock: Callable[[], float] = trio.current_time,
        stored_identity: Callable[[str], Awaitable[NodeIdentity | None]] | None = None,
    ) -> None:
        # The identity the store holds for a node id (onboarded nodes: token digest, labels), or None.
        self.stored_identity = stored_identity
        self._stored_labels: dict[str, dict[str, str]] = {}
        self.inventory = inventory
        self.config = config
        self.token_digests = set(token_digests)
        self.engines = engines
        # Told of every change and every command's fate; the fencing token comes from it
        # (fleet/events.py: the reconciler listens).
        self.events = events or NodeEvents()
        # Whether this daemon may accept nodes (the leader) or must send them on (``leadership``).
        self.role = role or Role(leader=True)
        self.clock = clock
        self.sessions: dict[str, _Session] = {}
        self._log_seq = 0
        self._closed = trio.Event()
        if config.open_fleet:
            log.warning(
                "agents.open_fleet is on: any node id joins with any token, is placed on and sent "
                "prompts; only for a network where everyone who can reach the agent listener is trusted"
            )

    # ------------------------------------------------------------------ the Dispatcher

    def send(self, node_id: str, command: Command) -> bool:
        # A span per command (llmgw_shared/tracing.py), the child of the reconcile pass that sent it.
        with tracing.span(
            "llmgw.node_command",
            {"llmgw.node": node_id, "llmgw.command": type(command).__name__, "llmgw.command_id": command.id},
        ) as span:
            sent = self._queue_command(node_id, self._with_trace(node_id, command))
            span.set_attribute("llmgw.sent", sent)
            return sent

    def _with_trace(self, node_id: str, command: Command) -> Command:
        """``command`` carrying the current span's traceparent, for a node whose hello takes one
        (an older node refuses a frame with a key it does not know: it gets the command as is)."""
        session = self.sessions.get(node_id)
        if session is None or not session.trace_context or not isinstance(command, StartReplica | SetEngines):
            return command
        parent = tracing.traceparent()
        return attrs.evolve(command, traceparent=parent) if parent else command

    def _queue_command(self, node_id: str, command: Command) -> bool:
        session = self.sessions.get(node_id)
        if session is None:
            return False
        try:
            session.send_channel.send_nowait(command)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False  # the connection is ending: the command would never leave
        except trio.WouldBlock:
            # A node that cannot keep up with its commands is treated as gone: reconnecting gives
            # it a clean slate, and its hello tells us what it actually runs.
            log.warning("node %s is not reading its commands: disconnecting it", node_id)
            session.cancel_scope.cancel()
            return False
        return True

    async def replica_logs(self, node_id: str, replica_id: str, lines: int, cursor: str = "") -> ReplicaLogsReply:
        """Ask a connected node for a replica's last output lines (``LogsUnavailable`` if it cannot be)."""
        session = self.sessions.get(node_id)
        if session is None:
            raise LogsUnavailable(f"node {node_id} is not connected")
        if len(session.log_requests) >= MAX_LOG_REQUESTS:
            raise LogsUnavailable(f"node {node_id} has {MAX_LOG_REQUESTS} log requests waiting already")
        self._log_seq += 1
        request = GetReplicaLogs(id=f"logs{self._log_seq}", replica_id=replica_id, lines=lines, cursor=cursor)
        send, receive = trio.open_memory_channel[ReplicaLogsReply](1)
        session.log_requests[request.id] = send
        try:
            try:
                session.send_channel.send_nowait(request)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                raise LogsUnavailable(f"node {node_id} cannot take a request now") from None
            with trio.move_on_after(LOG_ANSWER_TIMEOUT):
                try:
                    return await receive.receive()
                except trio.EndOfChannel:
                    raise LogsUnavailable(f"node {node_id} disconnected before it answered") from None
            raise LogsUnavailable(f"node {node_id} did not answer within {LOG_ANSWER_TIMEOUT:g} s")
        finally:
            session.log_requests.pop(request.id, None)
            send.close()
            receive.close()

    async def wait_all_closed(self) -> None:
        while self.sessions:
            self._closed = trio.Event()
            await self._closed.wait()

    def close_all(self, reason: str) -> None:
        for session in list(self.sessions.values()):
            log.info("closing connection of node %s: %s", session.node_id, reason)
            session.cancel_scope.cancel()

    # ------------------------------------------------------------------ one connection

    async def serve(
        self, socket: Socket, peer: str, *, certified_node_id: str | None = None, certificate_required: bool = False
    ) -> None:
        """One node's connection; with mutual TLS, ``certified_node_id`` is what its certificate says."""
        hello = await self._handshake(socket, peer, certified_node_id, certificate_required)
        if hello is None:
            return
        session = _Session(hello.node_id, self.config.command_queue, frozenset(hello.features))
        node = self._register(hello, peer)
        self.sessions[hello.node_id] = session
        log.info("node %s connected from %s", hello.node_id, peer, extra={"node": hello.node_id})
        try:
            with session.cancel_scope:
                await socket.send(encode(Welcome(PROTOCOL_VERSION, self.config.heartbeat_interval)))
                # A span of its own: the node's installs are its children (``_with_trace``).
                with tracing.span(
                    "llmgw.node_command",
                    {"llmgw.node": hello.node_id, "llmgw.command": "SetEngines", "llmgw.command_id": "engines-0"},
                ):
                    engines = self._with_trace(
                        hello.node_id, SetEngines("engines-0", self.events.fencing_token(), self.engines())
                    )
                await socket.send(encode(engines))
                self.events.changed()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._reader, socket, session, node)
                    nursery.start_soon(self._writer, socket, session)
                    nursery.start_soon(self._watchdog, session, node)
        finally:
            if self.sessions.get(hello.node_id) is session:
                del self.sessions[hello.node_id]
                self._closed.set()
                node.connected = False
                log.info("node %s disconnected", hello.node_id, extra={"node": hello.node_id})
                self.events.changed()
            self._account_for(session)
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                # The peer may be gone already.
                with contextlib.suppress(Exception):
                    await socket.close(1000, "bye")

    async def _handshake(
        self, socket: Socket, peer: str, certified_node_id: str | None, certificate_required: bool
    ) -> Hello | None:
        """The hello, or None once the connection was refused (with the reason) or timed out.

        ``decode`` is where a hello's names are checked (the node id exactly as onboarding checks
        it, engine names, replica ids, the address): a hello that fails is refused before anything
        of it is logged or stored. Who may join is ``_admits``: a certificate naming the node under
        mutual TLS, else the node's own onboarding token, a shared join token, or an open fleet.
        """
        with trio.move_on_after(self.config.hello_timeout):
            raw = await socket.receive()
            break_reason = ""
            try:
                msg = decode(raw)
            except WireError as exc:
                await self._refuse(socket, f"bad hello: {exc}", peer)
                return None
            if not isinstance(msg, Hello):
                await self._refuse(socket, f"the first frame must be hello, not {type(msg).__name__}", peer)
                return None
            if msg.protocol_version != PROTOCOL_VERSION:
                break_reason = (
                    f"protocol version {msg.protocol_version} is not supported; this control speaks {PROTOCOL_VERSION}"
                )
            elif not self.role.leader:
                await socket.send(
                    encode(
                        Refuse(
                            f"standby, leader is {self.role.leader_address or 'unknown'}",
                            self.role.leader_address or "",
                        )
                    )
                )
                log.info("refused node %s: this control is a standby", msg.node_id)
                # The node closes as soon as it reads the refusal and hypercorn may be answering that
                # close while we send ours (BusyResourceError): the refusal is delivered, the close
                # is a courtesy, and a traceback per refused node during a failover is only noise.
                with contextlib.suppress(trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError):
                    await socket.close(1013, "standby")
                return None
            elif certificate_required and certified_node_id is None:
                break_reason = "a client certificate naming the node is required"
            elif certified_node_id is not None and certified_node_id != msg.node_id:
                break_reason = (
                    f"the client certificate is for node {certified_node_id}, but the hello says {msg.node_id}"
                )
            # The token is looked up even with a certificate: it also loads an onboarded node's labels.
            elif not await self._token_ok(msg.node_id, msg.join_token) and certified_node_id is None:
                break_reason = (
                    "bad join token: this node id needs its own token (llmgw-control ctl nodes add "
                    "prints it) or a shared join token control knows"
                )
            elif msg.node_id in self.sessions:
                break_reason = f"node id {msg.node_id} is already connected"
            if break_reason:
                await self._refuse(socket, break_reason, peer, node_id=msg.node_id)
                return None
            return msg
        log.warning("no hello from %s within %g s: closing", peer, self.config.hello_timeout)
        await socket.close(1008, "no hello")
        return None

    async def _refuse(self, socket: Socket, reason: str, peer: str, node_id: str = "") -> None:
        log.warning("refused agent connection from %s%s: %s", peer, f" (node {node_id})" if node_id else "", reason)
        await socket.send(encode(Refuse(reason)))
        await socket.close(1008, reason[:100])

    async def _token_ok(self, node_id: str, token: str) -> bool:
        """Whether ``token`` lets ``node_id`` join: the one check for the socket and the files.

        An onboarded node id (one the store has an identity for) accepts its own token and no
        other, so nobody can take over an onboarded node's name, not with a shared token either.
        Any other id needs a shared token whose digest is configured, unless the fleet was opened
        on purpose (``open_fleet``). When the store cannot say, the answer is no: the node retries.
        """
        digest = token_digest(token)
        if self.stored_identity is not None:
            try:
                identity = await self.stored_identity(node_id)
            except Exception as exc:
                log.warning("cannot check node %s's join token now: %s", node_id, exc)
                return False
            if identity is not None:
                self._stored_labels[node_id] = dict(identity.labels)
                return hmac.compare_digest(digest, identity.token_digest)
        # Compared with every digest, so the time taken does not say which one was close.
        matches = [hmac.compare_digest(digest, known) for known in self.token_digests]
        return any(matches) or self.config.open_fleet

    async def enrolled(self, node_id: str, token: str) -> bool:
        """Whether these are the credentials of a node that may join (for the files it fetches)."""
        try:
            check_node_id(node_id)
        except BadName:
            return False
        return await self._token_ok(node_id, token)

    def _register(self, hello: Hello, peer: str) -> NodeRecord:
        now = self.clock()
        existing = self.inventory.get(hello.node_id)
        node = NodeRecord(
            node_id=hello.node_id,
            address=hello.address or peer,
            facts=hello.facts,
            last_seen=now,
            connected_since=now,
            # Labels given when the node was onboarded (the store) win over what this process knew.
            labels=self._stored_labels.pop(hello.node_id, existing.labels if existing else {}),
            cordoned=existing.cordoned if existing else False,
        )
        node.update_engines(hello.engines)
        node.update_replicas(hello.replicas)
        node.weights = list(hello.weights)
        self.inventory.put(node)
        return node

    async def _reader(self, socket: Socket, session: _Session, node: NodeRecord) -> None:
        bad_frames = 0
        while True:
            raw = await socket.receive()
            node.last_seen = self.clock()
            try:
                msg = decode(raw)
            except WireError as exc:
                bad_frames += 1
                log.warning("node %s sent a bad frame: %s", node.node_id, exc, extra={"node": node.node_id})
                await socket.send(encode(Error(f"bad frame: {exc}")))
                if bad_frames >= _MAX_BAD_FRAMES:
                    log.warning("node %s sent %d bad frames in a row: disconnecting", node.node_id, bad_frames)
                    session.cancel_scope.cancel()
                continue
            bad_frames = 0
            await self._apply(socket, session, node, msg)

    async def _apply(self, socket: Socket, session: _Session, node: NodeRecord, msg: Message) -> None:
        changed = False
        if isinstance(msg, Heartbeat):
            if msg.facts is not None:
                node.facts = msg.facts
            if msg.weights is not None:
                node.weights = msg.weights
            if msg.engines:
                node.update_engines(msg.engines)
                changed = True
            if msg.replicas:
                node.update_replicas(msg.replicas)
                changed = True
        elif isinstance(msg, EngineStateReport):
            node.update_engines([msg.engine])
            changed = True
        elif isinstance(msg, ReplicaStateReport):
            node.update_replicas([msg.replica])
            changed = True
        elif isinstance(msg, Ack):
            entry = session.pending.pop(msg.command_id, None)
            command = entry[0] if entry is not None else None
            if not msg.ok:
                log.warning(
                    "node %s refused command %s: %s",
                    node.node_id,
                    msg.command_id,
                    msg.error,
                    extra={"node": node.node_id},
                )
                if command is not None:
                    self.events.command_failed(
                        node.node_id, command, f"node {node.node_id} refused {TAGS[type(command)]}: {msg.error}"
                    )
                    changed = True
        elif isinstance(msg, ReplicaLogsReply):
            waiter = session.log_requests.pop(msg.in_reply_to, None)
            if waiter is not None:
                with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    waiter.send_nowait(msg)
        elif isinstance(msg, Error):
            log.warning("node %s reported an error: %s", node.node_id, msg.message, extra={"node": node.node_id})
        else:
            await socket.send(encode(Error(f"unexpected {type(msg).__name__} from a node")))
        if changed:
            self.events.changed()

    async def _writer(self, socket: Socket, session: _Session) -> None:
        """The only sender: queued commands, and a heartbeat whenever none was due to go out.

        Only the wait for a command is under the heartbeat timer. A send is never interrupted
        by it: the timer once cancelled ``socket.send`` with the command already taken from the
        queue, and the command was gone. A command is pending (awaiting its ack) from then on.

        Cancellation: when the session ends, a command still queued never left, and the one in
        hand may not have; ``_account_for`` reports both (a start that did arrive after all is
        in the node's next hello, and adopted).
        """
        seq = 0
        interval = self.config.heartbeat_interval
        next_beat = trio.current_time()
        while True:
            command: Command | GetReplicaLogs | None = None
            with trio.move_on_at(next_beat):
                command = await session.receive_channel.receive()
            if isinstance(command, GetReplicaLogs):
                # A read, answered by a ReplicaLogsReply rather than an ack: nothing to account for.
                await socket.send(encode(command))
                continue
            if command is not None:
                session.in_hand = command
                # Pending before the send: the node's ack may be read while the send is on its way.
                session.pending[command.id] = (command, self.clock())
                await socket.send(encode(command))
                session.in_hand = None
                continue
            seq += 1
            await socket.send(encode(Heartbeat(seq)))
            next_beat = trio.current_time() + interval

    def _account_for(self, session: _Session) -> None:
        """The connection ended: report every command that did not leave (or may not have)."""
        session.send_channel.close()
        for waiter in session.log_requests.values():
            waiter.close()  # its request ends with "disconnected before it answered"
        session.log_requests.clear()
        in_hand = session.in_hand
        unsent: list[Command] = [in_hand] if in_hand is not None and not isinstance(in_hand, GetReplicaLogs) else []
        session.in_hand = None
        while True:
            try:
                queued = session.receive_channel.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if not isinstance(queued, GetReplicaLogs):
                unsent.append(queued)
        session.receive_channel.close()
        if unsent or session.pending:
            log.info(
                "node %s: connection ended with %d command(s) unsent and %d unacknowledged",
                session.node_id,
                len(unsent),
                len(session.pending),
                extra={"node": session.node_id},
            )
        for command in unsent:
            self.events.command_unsent(session.node_id, command)

    async def _watchdog(self, session: _Session, node: NodeRecord) -> None:
        """Close a node that went silent, or that leaves a command unacknowledged too long."""
        limit = self.config.unreachable_after
        ack_limit = self.config.ack_timeout
        while True:
            now = self.clock()
            silent = now - node.last_seen
            if silent > limit:
                log.warning(
                    "node %s silent for %.1f s: closing its connection",
                    node.node_id,
                    silent,
                    extra={"node": node.node_id},
                )
                session.cancel_scope.cancel()
                return
            oldest = next(iter(session.pending.values()), None)
            if oldest is not None and now - oldest[1] > ack_limit:
                self._unacknowledged(session, node, ack_limit)
                return
            wait = min(limit - silent, self.config.heartbeat_interval)
            if oldest is not None:
                wait = min(wait, ack_limit - (now - oldest[1]))
            await trio.sleep(max(0.05, wait + 0.01))

    def _unacknowledged(self, session: _Session, node: NodeRecord, limit: float) -> None:
        command, _ = next(iter(session.pending.values()))
        reason = f"node {node.node_id} did not acknowledge {TAGS[type(command)]} within {limit:g} s"
        log.warning("%s: closing its connection (its hello will say what it has)", reason, extra={"node": node.node_id})
        now = self.clock()
        for late, sent_at in list(session.pending.values()):
            if now - sent_at > limit:
                self.events.command_failed(node.node_id, late, reason)
        session.pending.clear()
        session.cancel_scope.cancel()
        self.events.changed()
