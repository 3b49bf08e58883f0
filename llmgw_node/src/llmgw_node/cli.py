"""``llmgw-node``: run the daemon, print host facts, install and check engines by hand.

``engines install`` does exactly what the daemon does for control (same code, same proof), so
node images can be baked with an engine in place and a failing install can be debugged on the
machine itself. Every refusal is one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import ssl
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx2
import trio

from llmgw_node.agent import Agent
from llmgw_node.config import ConfigError, NodeConfig, load_config
from llmgw_node.control_auth import control_client
from llmgw_node.engines.manager import EngineManager
from llmgw_node.engines.release import platform_for
from llmgw_node.probe import probe
from llmgw_node.service import open_node_service
from llmgw_node.tls import client_context
from llmgw_shared import sdnotify
from llmgw_shared.engine_lifecycle import EngineInstall
from llmgw_shared.facts import HostFacts
from llmgw_shared.lifecycle import signals_outside_the_loop, stop_on_signals
from llmgw_shared.logs import get_logger, setup_logging
from llmgw_shared.wire import EngineSpec, EngineState, converter

log = get_logger(__name__)
DEFAULT_CONFIG = "/etc/llmgw/node.toml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw-node", description="llmgw node daemon: host facts, engine installs, engine supervision."
    )
    # The installer runs this in a new environment before switching to it: it must print the
    # version that environment holds (the distribution's metadata, not a constant in the code).
    parser.add_argument("--version", action="version", version=f"llmgw-node {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser, *, config_required: bool = False) -> None:
        p.add_argument(
            "--config",
            required=config_required,
            help=f"node config file (TOML; default {DEFAULT_CONFIG} when it exists)",
        )
        if not config_required:
            p.add_argument("--data-dir", help="override the config's data_dir")

    run = sub.add_parser("run", help="run the daemon")
    common(run, config_required=True)
    run.add_argument(
        "--stop-engines",
        action="store_true",
        help="on SIGTERM, stop the engines too (default: leave them running for the next daemon to adopt)",
    )

    pr = sub.add_parser("probe", help="print host facts and engine states")
    common(pr)
    pr.add_argument("--json", action="store_true", help="machine-readable output")

    eng = sub.add_parser("engines", help="install, list and check engines without control")
    esub = eng.add_subparsers(dest="engines_command", required=True, metavar="ACTION")
    inst = esub.add_parser("install", help="install and prove an engine release")
    common(inst)
    inst.add_argument("name", help="engine name, e.g. llama.cpp")
    inst.add_argument("version", help="release tag, e.g. b11312")
    inst.add_argument(
        "--release-api",
        default="",
        help="GitHub-shaped release JSON URL ({version} is replaced); default: the engine's own",
    )
    common(esub.add_parser("list", help="list installed and configured engines"))
    common(
        esub.add_parser(
            "check",
            help="re-prove every installed engine (ldd and --version) and hash its kept "
            "archives again (keep_engine_archives)",
        )
    )

    init = sub.add_parser("init", help="write a commented config with every option, or --check one")
    init.add_argument("--output", "-o", help="file to write (default: standard output)")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.add_argument("--check", metavar="CONFIG", help="validate CONFIG as run would, and exit (0: ok)")
    init.add_argument(
        "--control",
        action="append",
        default=[],
        metavar="URL",
        help="control agent URL, ws://host:port/agent/v1 (repeatable)",
    )
    init.add_argument("--node-id", help="this node's name (default: the host name)")
    init.add_argument("--data-dir", help="where engines and weights live")
    init.add_argument("--token-file", help="file holding the join token (default: $LLMGW_JOIN_TOKEN)")
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("llmgw-node")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed as a distribution)"


def _config(args: argparse.Namespace) -> NodeConfig:
    if args.config:
        config = load_config(args.config)
    elif Path(DEFAULT_CONFIG).exists():
        config = load_config(DEFAULT_CONFIG)
    else:
        config = NodeConfig()
    if getattr(args, "data_dir", None):
        config = attrs.evolve(config, data_dir=args.data_dir)
    return config


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "init":
        from llmgw_node import init_config

        raise SystemExit(
            init_config.main(
                args.output,
                force=args.force,
                check_path=args.check,
                control=args.control,
                node_id=args.node_id,
                data_dir=args.data_dir,
                token_file=args.token_file,
            )
        )
    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"llmgw-node: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    setup_logging(config.log_level)
    try:
        if args.command == "run":
            # Before anything starts: an unreadable certificate is a config error, not a retry loop.
            tls = client_context(config)
            code = _run_daemon(config, args.stop_engines, tls)
        elif args.command == "probe":
            code = trio.run(_probe, config, args.json)
        else:
            code = trio.run(_engines, config, args)
    except KeyboardInterrupt:
        code = 130
    except ConfigError as exc:
        print(f"llmgw-node: {exc}", file=sys.stderr)
        code = 2
    except OSError as exc:
        # probe and engines on a data_dir they cannot read or create: one line, not a traceback.
        print(f"llmgw-node: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", file=sys.stderr)
        code = 1
    raise SystemExit(code)


def _run_daemon(config: NodeConfig, stop_engines: bool, tls: ssl.SSLContext | None) -> int:
    try:
        with signals_outside_the_loop():
            code: int = trio.run(_run, config, stop_engines, tls)
        return code
    except* OSError as group:
        # An unwritable data_dir (ProtectSystem=strict and a data_dir outside StateDirectory, say):
        # one line that says so, not a traceback.
        for error in _leaves(group):
            print(f"llmgw-node: stopped: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except* KeyboardInterrupt:
        # A second SIGTERM/SIGINT while stopping ("out now", logged by stop_on_signals) comes out
        # of the nursery inside a group, which `except KeyboardInterrupt` in main would not catch.
        raise SystemExit(130) from None
    except* Exception as group:
        # A bug: through the log handler, so the journal gets one structured line (traceback in
        # its "exc" field, secrets scrubbed) instead of raw multi-line stderr.
        log.critical("llmgw-node crashed", exc_info=group)
        raise SystemExit(1) from None


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for error in group.exceptions:
        out.extend(_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return out


async def _run(config: NodeConfig, stop_engines: bool, tls: ssl.SSLContext | None) -> int:
    if not config.control:
        log.warning("no control URLs configured: the node runs standalone and takes no commands")
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(stop_on_signals, shutdown)
        # systemd (Type=notify): watchdog pings from this event loop; STOPPING=1 on the signal.
        nursery.start_soon(sdnotify.watchdog_loop)
        nursery.start_soon(sdnotify.stopping_on, shutdown)
        async with open_node_service(config, stop_engines_on_exit=stop_engines) as svc:
            engines = [e.describe() for e in svc.engine_states()]
            log.info("node %s running", config.node_id, extra={"data_dir": config.data_dir, "engines": engines})
            async with trio.open_nursery() as inner:
                if config.control:
                    agent = Agent(svc, ssl_context=tls)
                    inner.start_soon(agent.run)
                    inner.start_soon(_ready_when_welcomed, agent)
                else:
                    await sdnotify.ready("running standalone (no control configured)")
                await shutdown.wait()
                inner.cancel_scope.cancel()
            if not stop_engines and svc.replica_states():
                log.info("leaving %d engine(s) running for the next daemon to adopt", len(svc.replica_states()))
        nursery.cancel_scope.cancel()
    # The one line that says the stop is complete, as llmgw-control's "llmgw-control stopped".
    log.info("llmgw-node stopped")
    return 0


async def _ready_when_welcomed(agent: Agent) -> None:
    """READY=1 once control first welcomes this node: before that it can run nothing."""
    await sdnotify.status("connecting to control")
    while not agent.status.sessions:
        await agent.status.changed.wait()
    await sdnotify.ready(f"connected to {agent.status.connected_to}")


async def _manager(config: NodeConfig, client: httpx2.AsyncClient, facts: HostFacts | None = None) -> EngineManager:
    facts = facts or await probe(config.data_path)

    def report(state: EngineState) -> None:
        if EngineInstall(state.status) is EngineInstall.INSTALLING:
            print(f"{state.name} {state.version}: {state.describe()}", file=sys.stderr, flush=True)

    return EngineManager.from_config(config, client, platform_for(facts, config.engine_backend), on_change=report)


async def _probe(config: NodeConfig, as_json: bool) -> int:
    facts = await probe(config.data_path)
    async with control_client(config) as client:
        mgr = await _manager(config, client, facts)
        await mgr.load()
    engines = mgr.states()
    if as_json:
        out: dict[str, Any] = {
            "facts": converter.unstructure(facts),
            "engines": [converter.unstructure(e) for e in engines],
        }
        print(json.dumps(out, indent=2))
        return 0
    rows = [
        ("host", facts.hostname),
        ("os", f"{facts.os_name} {facts.os_version} (kernel {facts.kernel})"),
        (
            "cpu",
            f"{facts.cpu_model} ({facts.cores} cores, {facts.arch}; "
            f"{' '.join(facts.cpu_features) or 'no vector extensions'})",
        ),
        ("ram", f"{facts.ram_total_mib} MiB ({facts.ram_available_mib} MiB available)"),
        ("disk", f"{facts.disk_free_mib} MiB free in {facts.data_dir}"),
        ("nvidia", f"driver {facts.nvidia_driver}" if facts.nvidia_driver else "no driver loaded"),
    ]
    rows += [
        (f"gpu {g.index}", f"{g.name} {g.uuid} ({g.memory_free_mib}/{g.memory_total_mib} MiB free)") for g in facts.gpus
    ]
    rows.append(
        ("gpus", f"through {', '.join(facts.gpu_backends)}" if facts.gpu_backends else "none")
        if not facts.gpus_unusable
        else ("gpus", f"none usable: {facts.gpus_unusable}")
    )
    rows += [("engine", f"{e.name}: {e.describe()}") for e in engines] or [("engine", "none")]
    if degraded := mgr.degraded():
        rows.append(("DEGRADED", f"{degraded}; GPU profiles are not placed here"))
    rows += [("warning", w) for w in facts.warnings]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


async def _engines(config: NodeConfig, args: argparse.Namespace) -> int:
    async with control_client(config) as client:
        mgr = await _manager(config, client)
        if args.engines_command == "install":
            await mgr.load()
            state = await mgr.install(EngineSpec(args.name, args.version, args.release_api))
            if EngineInstall(state.status) is not EngineInstall.INSTALLED:
                print(f"llmgw-node: {args.name} {args.version}: {state.describe()}", file=sys.stderr)
                return 1
            print(f"{state.name} {state.version}: {state.describe()} ({state.reported_version}) at {state.binary}")
            return 0
        # load() proves every install (ldd and --version): exactly what "check" asks for.
        checking = args.engines_command == "check"
        await mgr.load(prove=checking, verify_archives=checking)
        states = mgr.states()
        if not states:
            print("no engines installed or configured")
        for s in states:
            extra = f" ({s.reported_version})" if s.reported_version else ""
            print(f"{s.name} {s.version}: {s.describe()}{extra}")
            if s.provenance is not None:
                print(f"  {s.provenance.describe()}")
        bad = [s for s in states if EngineInstall(s.status) is EngineInstall.FAILED]
        return 1 if args.engines_command == "check" and bad else 0
