"""``llmgw-control``: the control daemon's command line."""

from __future__ import annotations

import argparse
import sys
from functools import partial

import trio

from llmgw_shared import sdnotify
from llmgw_shared.config import ConfigError
from llmgw_shared.gcpause import collect_young_generation_less_often, keep_gc_pauses_short
from llmgw_shared.lifecycle import signals_outside_the_loop, stop_on_signals
from llmgw_shared.logs import get_logger, setup_logging

from .config import ControlConfig, load_config, parse_endpoint_flag

log = get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmgw-control", description="llmgw control daemon")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="serve the OpenAI API, the admin API and the agent endpoint")
    run.add_argument("--config", help="TOML config file")
    run.add_argument("--listen", help="client API address, host:port (default 127.0.0.1:8080)")
    run.add_argument("--admin-listen", help="admin API and metrics address (default 127.0.0.1:8081)")
    run.add_argument("--metrics-listen", help="optional metrics-only address")
    run.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="ID=URL=MODEL[,MODEL]",
        help="a static engine replica (repeatable), e.g. e1=http://127.0.0.1:8001=tiny",
    )
    run.add_argument("--data-dir", help="control's state directory (secrets, the embedded store)")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", choices=["auto", "json", "text"])
    # Set by the supervisor of ``workers = N`` on the processes it starts (workers.py), not by people.
    run.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    run.add_argument("--worker-listen", help=argparse.SUPPRESS)
    run.add_argument("--worker-ready-fd", type=int, help=argparse.SUPPRESS)
    init = commands.add_parser("init", help="write a commented config with every option, or --check one")
    init.add_argument("--output", "-o", help="file to write (default: standard output)")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.add_argument("--check", metavar="CONFIG", help="validate CONFIG as run would, and exit (0: ok)")
    commands.add_parser(
        "ctl",
        help="manage the fleet, models, keys and quotas through the admin API (llmgw-control ctl --help)",
        add_help=False,
    )
    commands.add_parser(
        "release",
        help="prepare the exact wheel set nodes install, from uv.lock (llmgw-control release --help)",
        add_help=False,
    )
    commands.add_parser(
        "engines",
        help="fetch files nodes need for their engines, e.g. the CUDA runtime wheels (llmgw-control engines --help)",
        add_help=False,
    )
    token = commands.add_parser(
        "join-token", help="make a shared join token for nodes, and its digest for agents.join_token_digests"
    )
    token.add_argument(
        "--digest",
        action="store_true",
        help="print only the digest of a token read from standard input (never from argv, which ps shows everyone)",
    )
    return parser


def join_token(*, digest_only: bool) -> int:
    """A new shared join token and its digest, or (``digest_only``) the digest of one on stdin."""
    from .fleet.agents import token_digest
    from .fleet.onboarding import new_join_token

    if digest_only:
        token = sys.stdin.readline().strip()
        if not token:
            print("llmgw-control join-token --digest: no token on standard input", file=sys.stderr)
            return 2
        print(token_digest(token))
        return 0
    token = new_join_token()
    print('A shared join token (shown only this once): put it in each node\'s config as token = "..."')
    print(f"  {token}")
    print("Its digest: add it to agents.join_token_digests in the control config, then restart control")
    print(f"  {token_digest(token)}")
    print("A node onboarded with `llmgw-control ctl nodes add NAME` gets a token of its own instead.")
    return 0


def config_from_args(args: argparse.Namespace) -> ControlConfig:
    endpoints = [parse_endpoint_flag(text) for text in args.endpoint]
    return load_config(
        args.config,
        {
            "listen": args.listen,
            "admin_listen": args.admin_listen,
            "metrics_listen": args.metrics_listen,
            "log_level": args.log_level,
            "log_format": args.log_format,
            "extra_endpoints": endpoints,
            "data_dir": args.data_dir,
        },
    )


async def _supervise(config: ControlConfig, argv: list[str]) -> int:
    """``workers`` > 1: this process starts and watches the workers, and serves nothing itself."""
    from .app import data_dir_of
    from .workers import WorkerSupervisor, address_of, prepare_shared_state, reserve_client_port

    await prepare_shared_state(config, data_dir_of(config))
    reserved = reserve_client_port(config.listen)
    try:
        return await WorkerSupervisor(config, argv, address_of(reserved)).run()
    finally:
        reserved.close()


async def _run(config: ControlConfig, *, worker: int | None = None, ready_fd: int | None = None) -> None:
    # Imported here so that config errors and --help answer without loading the web stack.
    from .app import run_control
    from .workers import announce_ready, watch_supervisor

    collect_young_generation_less_often()
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(stop_on_signals, shutdown)
        if worker is not None:
            nursery.start_soon(watch_supervisor, shutdown)
        # systemd (Type=notify): the watchdog pings come from this event loop, so a wedged
        # loop gets the daemon restarted; READY=1 only once every listener is bound.
        nursery.start_soon(sdnotify.watchdog_loop)
        nursery.start_soon(sdnotify.stopping_on, shutdown)
        nursery.start_soon(keep_gc_pauses_short)
        async with trio.open_nursery() as daemon:
            listening = await daemon.start(partial(run_control, config, shutdown=shutdown, worker=worker))
            await sdnotify.ready(f"serving on {listening.api_url}")
            if ready_fd is not None:
                announce_ready(ready_fd)
        nursery.cancel_scope.cancel()
    log.info("llmgw-control stopped")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ctl"]:
        # Handed over before parsing: ctl has its own parser (nouns and verbs), and needs neither
        # the config nor logging, only the admin API's URL.
        from .ctl import main as ctl_main

        raise SystemExit(ctl_main(argv[1:]))
    if argv[:1] == ["release"]:
        from .release_cli import main as release_main

        raise SystemExit(release_main(argv[1:]))
    if argv[:1] == ["engines"]:
        from .engines_cli import main as engines_main

        raise SystemExit(engines_main(argv[1:]))
    args = build_parser().parse_args(argv)
    if args.command == "join-token":
        raise SystemExit(join_token(digest_only=args.digest))
    if args.command == "init":
        from . import init_config

        raise SystemExit(init_config.main(args.output, force=args.force, check_path=args.check))
    try:
        config = config_from_args(args)
        if args.worker is not None:
            from .workers import worker_config

            config = worker_config(config, args.worker, args.worker_listen or config.listen)
        elif config.workers > 1:
            from .workers import check_worker_ports

            check_worker_ports(config)
    except ConfigError as exc:
        print(f"llmgw-control: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    json_lines = {"json": True, "text": False}.get(config.log_format)
    setup_logging(config.log_level, json_lines=json_lines)
    from .store import StoreError

    try:
        with signals_outside_the_loop():
            if config.workers > 1:
                raise SystemExit(trio.run(_supervise, config, argv))
            trio.run(partial(_run, config, worker=args.worker, ready_fd=args.worker_ready_fd))
    except* (OSError, StoreError, ConfigError) as group:
        # An address in use, an unreachable database, an admin listener no key could open: one
        # line that says so, not a traceback.
        for error in _leaves(group):
            print(f"llmgw-control: cannot start: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except* KeyboardInterrupt:
        raise SystemExit(130) from None
    except* Exception as group:
        # A bug: through the log handler, so the journal gets one structured line (traceback in
        # its "exc" field, secrets scrubbed) instead of raw multi-line stderr.
        log.critical("llmgw-control crashed", exc_info=group)
        raise SystemExit(1) from None


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for error in group.exceptions:
        out.extend(_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return out


if __name__ == "__main__":  # how the supervisor starts its workers (python -m llmgw_control.cli run ...)
    main()
