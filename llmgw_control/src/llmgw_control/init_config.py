"""``llmgw-control init``: a commented config with every option; ``--check`` validates one.

The file is generated from ``ControlConfig`` (see ``llmgw_shared.config_doc``); the one-line help
for each option lives in ``DOCS`` below unless the field carries ``metadata={"doc": ...}``. A
test fails when an option has neither, so a new option cannot ship without its line.
"""

from __future__ import annotations

import sys
from typing import Any

from llmgw_shared.config import ConfigError
from llmgw_shared.config_doc import render, write_output

from .catalog import ModelConfig, ProfileConfig, WeightsConfig
from .catalog.models import AdapterConfig
from .config import ControlConfig, load_config
from .gateway.config import StaticReplicaConfig

DOCS: dict[str, str] = {
    "ControlConfig.listen": "Client API address (the OpenAI endpoints), host:port; 0.0.0.0 for every address.",
    "ControlConfig.admin_listen": "Admin REST API, dashboard and /metrics, host:port; keep it on loopback.",
    "ControlConfig.admin_hosts": "Host names the admin listener answers to besides IP addresses and localhost, "
    'e.g. ["control.mgmt.example"] (others are refused: DNS rebinding).',
    "ControlConfig.admin_require_key": "Require an admin key (Authorization: Bearer) on every admin-listener "
    "request but /healthz; always on when admin_listen is not loopback.",
    "ControlConfig.metrics_listen": "An extra listener serving only /metrics, host:port (empty: none).",
    "ControlConfig.shutdown_grace": "Seconds in-flight requests get to finish after SIGTERM before they are cut.",
    "ControlConfig.workers": "Gateway processes on this machine sharing the client port (SO_REUSEPORT), "
    "supervised by this one; 1: one process (docs/operator-guide.md).",
    "ControlConfig.log_level": "debug, info, warning or error.",
    "ControlConfig.log_format": "auto (JSON unless stderr is a terminal), json or text.",
    "ControlConfig.data_dir": "Control's state directory: secrets and the embedded SQLite store "
    "(empty: $STATE_DIRECTORY under systemd, else ~/.local/state/llmgw/control).",
    "ControlConfig.store": "The store: a SQLite file, or postgresql://... shared by several control daemons "
    "(empty: <data_dir>/llmgw.db).",
    "ControlConfig.router": "How client requests are sent to engine replicas.",
    "ControlConfig.endpoints": "Static engine replicas (gateway-only mode, no nodes).",
    "ControlConfig.agents": "The agent listener nodes connect to, and how they are watched.",
    "ControlConfig.reconciler": "The loop that places and stops replicas.",
    "ControlConfig.activator": "The per-model queue of requests waiting for a replica slot (or for a replica "
    "to start).",
    "ControlConfig.leadership": "The leader lease when several control daemons share a store (docs/failover.md).",
    "ControlConfig.engines": "Engine builds every node installs and proves.",
    "ControlConfig.models": "Models served by the fleet, each with one or more profiles.",
    "ControlConfig.monitoring": "Where the dashboard finds metrics history.",
    "GatewayConfig.connect_timeout": "Seconds to connect to a replica before trying another.",
    "GatewayConfig.first_byte_timeout": "Seconds to wait for an engine's first byte (queueing and prompt included).",
    "GatewayConfig.idle_timeout": "Seconds a stream may stay silent before it is cut.",
    "GatewayConfig.max_attempts": "Replicas tried per request, counting the first (only before any byte is sent).",
    "GatewayConfig.max_continuations": "Times a chat or completions stream whose engine broke off after bytes "
    "reached the client is continued on another replica (0: never).",
    "GatewayConfig.continue_streams": "Per model (name or model:profile): false stops its streams from being "
    "continued; models not named are.",
    "GatewayConfig.cooldown": "Seconds a replica that failed is avoided while others can serve.",
    "GatewayConfig.hang_suspect_after": "Seconds requests wait without a byte from an engine before its /health "
    "is asked (a hang is that silence and no /health answer).",
    "GatewayConfig.hang_probe_timeout": "Seconds a suspect engine's /health has to answer before its replica is "
    "withdrawn as hung and its waiting requests moved.",
    "GatewayConfig.hang_check_every": "Seconds between the hang watch's looks at every replica's progress.",
    "GatewayConfig.hung_probe_every": "Seconds between /health probes of a hung replica; a 200 re-admits it.",
    "GatewayConfig.max_body_bytes": "Largest request body accepted (413 above).",
    "GatewayConfig.default_profile": "Profile used when a client names a model without one, for models that have it.",
    "GatewayConfig.routing": "How a replica is chosen: prefix (a conversation or session stays on the replica "
    "caching it, within a load bound) or least-loaded; a profile's routing overrides it.",
    "GatewayConfig.affinity_load_factor": "ε of prefix routing's load bound: a replica keeps its conversations "
    "while it holds at most (1 + ε) x the mean load + 1.",
    "GatewayConfig.allowed_origins": "Browser origins whose pages may call the client API (CORS), e.g. "
    '"https://chat.example.com", or "*"; empty: none. Credentials are never '
    "allowed (keys travel in headers).",
    "StaticReplicaConfig.id": "A name for this replica, used in logs, metrics and errors.",
    "StaticReplicaConfig.url": "The engine's base URL, e.g. http://10.0.0.5:8001.",
    "StaticReplicaConfig.models": "Model names this replica serves.",
    "StaticReplicaConfig.weight": "Relative share of traffic against other replicas of the same model.",
    "StaticReplicaConfig.api_key": "Bearer token sent to the engine (llama-server --api-key); never a client's key.",
    "StaticReplicaConfig.slots": "Requests sent to it at once, more wait in the gateway's queue "
    "(llama-server: its -np).",
    "StaticReplicaConfig.engine_slots": "llama-server only: its -np, so prefix routing keeps each conversation on its "
    "own slot (id_slot); 0: the engine chooses.",
    "AgentsConfig.listen": "Where nodes connect, host:port (empty: no nodes, gateway-only mode).",
    "AgentsConfig.public_url": "How nodes reach the agent listener, for files and install commands "
    "(empty: http://<listen>).",
    "AgentsConfig.join_token_digests": "Digests (sha256:<hex>) of shared join tokens a node id that was never "
    "onboarded may join with (llmgw-control join-token makes one); onboarded "
    "nodes use their own token.",
    "AgentsConfig.open_fleet": "Let any node id join with any token (a trusted lab network only; a warning at "
    "start). Off: only onboarded nodes, shared tokens above, or certificates.",
    "AgentsConfig.files_dir": "Directory of engines/, models/ and node-releases/ served to nodes (air-gapped "
    "clusters, onboarding: llmgw-control release prepare).",
    "AgentsConfig.tls_cert_file": "TLS certificate (PEM) for the agent listener: nodes use wss:// and https:// "
    "(empty: no TLS, trusted networks only).",
    "AgentsConfig.tls_key_file": "The private key (PEM) of tls_cert_file.",
    "AgentsConfig.tls_client_ca_file": "CA (PEM) that signs node certificates: mutual TLS, the node id taken "
    "from the certificate (empty: no client certificates).",
    "AgentsConfig.heartbeat_interval": "Seconds between heartbeats in each direction.",
    "AgentsConfig.unreachable_after": "Seconds without a heartbeat before a node gets no new traffic.",
    "AgentsConfig.lost_after": "Seconds without a heartbeat before a node's replicas are placed elsewhere.",
    "AgentsConfig.hello_timeout": "Seconds a new connection has to send its hello.",
    "AgentsConfig.max_frame_bytes": "Largest WebSocket frame accepted from a node.",
    "AgentsConfig.command_queue": "Commands queued per node before it is disconnected as too slow.",
    "AgentsConfig.ack_timeout": "Seconds a node has to acknowledge a command before the command fails and "
    "the node is reconnected.",
    "ReconcilerConfig.interval": "Seconds between reconcile passes (changes also wake it at once).",
    "ReconcilerConfig.port_min": "Lowest port given to an engine on a node.",
    "ReconcilerConfig.port_max": "Highest port given to an engine on a node.",
    "ReconcilerConfig.backoff_base": "Seconds before retrying a failed start on a node; doubles per failure.",
    "ReconcilerConfig.backoff_cap": "Longest wait between retries of a failed start.",
    "ReconcilerConfig.reschedule_burst": "Replicas moved off lost nodes at once before the rate limit applies.",
    "ReconcilerConfig.reschedules_per_minute": "Replicas moved off lost nodes per minute after the burst.",
    "ReconcilerConfig.reserved_ram_mib": "RAM (MiB) kept free on every node for the OS and the node daemon.",
    "ReconcilerConfig.assigned_timeout": "Seconds a started replica may go unreported by its node before it "
    "counts as failed.",
    "ReconcilerConfig.forget_nodes_after": "Seconds after which a silent (lost) node is forgotten: removed from "
    "the node list and the metrics.",
    "ReconcilerConfig.saturated_after": "Seconds every slot of a model stays busy (none queued) before another "
    "replica is started.",
    "ReconcilerConfig.evict_min_age": "Seconds after its placement before a replica may be evicted to make "
    "room for another model (no thrash).",
    "ReconcilerConfig.yield_after": "Seconds requests wait for a model that needs room before a busy resident "
    "model is drained and evicted for it (fairness); keep it below "
    "activator.max_wait.",
    "ReconcilerConfig.weights_keep_for": "Seconds a model file may stay unused on a node before control removes "
    "it (0: only when a download needs the room).",
    "ActivatorConfig.queue_size": "Requests that may wait per model for a slot; more get a 429 at once.",
    "ActivatorConfig.max_wait": "Seconds a request waits for a slot (or a replica to start) before a 503 that "
    "says why.",
    "ActivatorConfig.batch_after": "While both wait, a batch request goes after at most this many interactive ones.",
    "LeadershipConfig.ttl": "Seconds a lease grant lasts without a renew (a killed leader is replaced after it).",
    "LeadershipConfig.renew_interval": "Seconds between lease renewals.",
    "LeadershipConfig.advertise": "Agent URL (ws://host:port/agent/v1) standbys send nodes to while this "
    "daemon leads (empty: derived).",
    "LeadershipConfig.settle": "Seconds after becoming leader before replicas are started or stopped.",
    "LeadershipConfig.standby_serves": "A standby serves client traffic from the leader's published replicas "
    "(false: it answers 503 standby naming the leader).",
    "MonitoringConfig.prometheus": "The Prometheus scraping this daemon (http://host:9090), for dashboard "
    "history (empty: none).",
    "EngineConfig.name": "Engine name (llama.cpp, or one a node's config names by path).",
    "EngineConfig.version": "Release tag to install, e.g. b11312.",
    "EngineConfig.release_api": "GitHub-shaped release JSON URL with {version} (empty: control's files, else GitHub).",
    "ModelConfig.name": "What clients ask for (letters, digits, '.', '_', '-').",
    "ModelConfig.profiles": "Ways to run the model (e.g. gpu, cpu); a client may ask for model:profile.",
    "ModelConfig.default_profile": "Profile used when a client names only the model (empty: the first).",
    "ProfileConfig.name": "The profile's name.",
    "ProfileConfig.weights": "The model file (llama.cpp); vLLM and SGLang use model_dir instead.",
    "ProfileConfig.model_dir": "vLLM/SGLang: the model directory on the nodes (absolute, or hub:ORG/NAME[@REV]).",
    "ProfileConfig.engine": "Engine that runs it (one of [[engines]]).",
    "ProfileConfig.engine_version": "Engine version (empty: the one [[engines]] names).",
    "ProfileConfig.context": "Context size in tokens.",
    "ProfileConfig.parallel": "Requests one replica serves at once (engine slots).",
    "ProfileConfig.slots": "Requests the gateway sends one replica at once; more queue (0: parallel).",
    "ProfileConfig.routing": "prefix or least-loaded for this profile's replicas (empty: [router] routing).",
    "ProfileConfig.args": "Extra engine flags, after the ones llmgw sets.",
    "ProfileConfig.env": "Extra environment variables for the engine.",
    "ProfileConfig.ram_mib": "RAM claim in MiB (0: estimated from the GGUF header).",
    "ProfileConfig.vram_mib": "VRAM claim in MiB on GPU nodes.",
    "ProfileConfig.gpus": "GPUs one replica splits its VRAM claim over (tensor split); 1: one GPU.",
    "ProfileConfig.backend": 'Only nodes whose engine build carries this backend (cuda, rocm, vulkan, cpu); "": any.',
    "ProfileConfig.cpu_ok": "A GPU profile may run on the CPU of a degraded node (GPUs, CPU build only).",
    "ProfileConfig.min_replicas": "Replicas kept running even without traffic.",
    "ProfileConfig.max_replicas": "Most replicas started for demand.",
    "ProfileConfig.idle_timeout": "Seconds without traffic before a replica is stopped (0: never).",
    "ProfileConfig.labels": "Node labels a replica must run on.",
    "ProfileConfig.start_timeout": "Seconds an engine has to become healthy before the start counts as failed.",
    "ProfileConfig.ttft_target": "Latency objective: time to first token p99 in seconds (0: none). With an "
    "objective, the highest concurrency a capacity run measured meeting it is a "
    "replica's slot count on nodes of that kind (instead of parallel).",
    "ProfileConfig.itl_target": "Latency objective: inter-token latency p99 in seconds (0: none); see ttft_target.",
    "ProfileConfig.capabilities": "What it serves: routes (chat, completions, embeddings, responses, messages, "
    "rerank, tokenize, infill) and features (tools, vision, audio); a request for "
    "anything else is a 400. Empty: learned from the engine's flags and answers.",
    "ProfileConfig.adapters": "LoRA adapters on this profile's base model, each served as a model name of its own.",
    "AdapterConfig.name": "The model name clients ask for; it must differ from every model's and adapter's.",
    "AdapterConfig.weights": "The adapter: a GGUF LoRA for llama.cpp (verified like weights), a directory for vLLM.",
    "AdapterConfig.scale": "The adapter's strength when applied (1.0: as trained).",
    "WeightsConfig.url": "An http(s) URL the nodes can reach, or a path on the nodes.",
    "WeightsConfig.sha256": "The file's sha256 (64 hex digits), checked after download.",
    "WeightsConfig.size": "The file's size in bytes.",
}

HEADER = """\
llmgw-control configuration, written by `llmgw-control init`.

Every option is listed with a one-line description and its default; delete the lines you do not
change if you prefer new defaults to reach you on upgrade. Check a file with
`llmgw-control init --check FILE`; run with `llmgw-control run --config FILE`.
Reference: docs/operator-guide.md."""

EXAMPLE_MODEL = ModelConfig(
    name="qwen2.5-0.5b",
    profiles=[
        ProfileConfig(
            name="cpu",
            weights=WeightsConfig(
                url="http://files.example/qwen2.5-0.5b-instruct-q4_k_m.gguf", sha256="0" * 64, size=491400032
            ),
            args=["--threads", "4"],
            env={"LLAMA_ARG_FLASH_ATTN": "0"},
            labels={"pool": "cpu"},
            adapters=[
                AdapterConfig(
                    name="support-bot",
                    weights=WeightsConfig(
                        url="http://files.example/support-bot-lora.gguf", sha256="1" * 64, size=13631488
                    ),
                )
            ],
        )
    ],
)
EXAMPLE_STATIC_REPLICA = StaticReplicaConfig(id="gpu1", url="http://10.0.0.11:8001", models=["llama-3.1-8b"])
EXAMPLES: dict[str, list[Any]] = {"models": [EXAMPLE_MODEL], "endpoints": [EXAMPLE_STATIC_REPLICA]}


def render_config(config: ControlConfig | None = None) -> str:
    return render(config or ControlConfig(), DOCS, header=HEADER, examples=EXAMPLES)


def check(path: str) -> int:
    """Validate ``path`` exactly as ``run`` would; print the daemon's own message on failure."""
    try:
        load_config(path)
    except ConfigError as exc:
        print(f"llmgw-control: config error: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: ok")
    return 0


def write(text: str, output: str | None, *, force: bool) -> int:
    return write_output(text, output, force=force, mode=0o640, program="llmgw-control")


def main(output: str | None, *, force: bool, check_path: str | None) -> int:
    if check_path:
        return check(check_path)
    return write(render_config(), output, force=force)
