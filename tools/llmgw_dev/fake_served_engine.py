"""The fake engine behind vLLM's and SGLang's own command lines, for node and fleet tests.

A node starts vLLM as ``vllm serve DIR --host H --port P ...`` (its key in ``VLLM_API_KEY``) and
SGLang as ``python -m sglang.launch_server --model-path DIR --host H --port P --api-key K ...``.
Tests name a small script by path in the node's ``[[engines]]``, which runs::

    python -m llmgw_dev.fake_served_engine vllm "$@"      # or: sglang "$@"

and this module reads the arguments as that engine does, refuses what it would refuse (no model
directory, no config.json in it), prints start-up lines as it does, then serves the fake engine
(``fake_engine.py``: the OpenAI API) with that engine's ``/health`` and ``/metrics`` series.
``--version`` (vLLM) and ``-c ...`` (SGLang's version check) print a version and exit.

Timing comes from the environment, which a profile's ``env`` sets: ``FAKE_ENGINE_CHUNKS``,
``FAKE_ENGINE_CHUNK_DELAY`` (seconds between tokens: how a test keeps requests in flight during
a drain) and ``FAKE_ENGINE_START_DELAY`` (seconds before it listens: a model loading).

vLLM's LoRA options as vLLM takes them: ``--enable-lora`` (with ``--max-loras``,
``--max-lora-rank``) and, only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in the environment,
the run-time load and unload endpoints (``fake_lora.py``). vLLM refuses ``--lora-modules``
without ``--enable-lora``; so does the fake.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import trio

from llmgw_dev.fake_engine import FakeEngineBehavior, run_fake_engine
from llmgw_dev.fake_lora import FakeLoras

VERSIONS = {"vllm": "0.9.1", "sglang": "0.4.9"}


def _parser(engine: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=engine, add_help=False)
    if engine == "vllm":
        p.add_argument("command", choices=["serve"])
        p.add_argument("model")
        p.add_argument("--max-model-len", type=int, default=0)
        p.add_argument("--max-num-seqs", type=int, default=256)
        p.add_argument("--enable-lora", action="store_true")
        p.add_argument("--max-loras", type=int, default=1)
        p.add_argument("--max-lora-rank", type=int, default=16)
        p.add_argument("--lora-modules", nargs="+", default=[])
    else:
        p.add_argument("-m", dest="module", required=True, choices=["sglang.launch_server"])
        p.add_argument("--model-path", dest="model", required=True)
        p.add_argument("--api-key", default=None)
        p.add_argument("--context-length", type=int, default=0)
        p.add_argument("--max-running-requests", type=int, default=0)
        p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default="")
    return p


async def _serve(engine: str, args: argparse.Namespace, key: str | None) -> None:
    model = args.served_model_name or args.model
    live = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
    loras = FakeLoras(max_lora_rank=args.max_lora_rank) if engine == "vllm" and args.enable_lora and live else None
    behavior = FakeEngineBehavior(
        models=[model],
        api_key=key,
        metrics_as=engine,
        loras=loras,
        chunks=int(os.environ.get("FAKE_ENGINE_CHUNKS", "8")),
        chunk_delay=float(os.environ.get("FAKE_ENGINE_CHUNK_DELAY", "0")),
    )
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        await trio.sleep(float(os.environ.get("FAKE_ENGINE_START_DELAY", "0")))
        async with run_fake_engine(behavior, host=args.host, port=args.port) as fake:
            fake.observed.record = False
            print("INFO:     Started server process", flush=True)
            print(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", flush=True)
            async for _ in signals:
                print("INFO:     Shutting down", flush=True)
                break


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in VERSIONS:
        print("usage: python -m llmgw_dev.fake_served_engine vllm|sglang ARGS...", file=sys.stderr)
        return 2
    engine, rest = argv[0], argv[1:]
    if rest in (["--version"], ["-V"]) or (engine == "sglang" and rest[:1] == ["-c"]):
        print(VERSIONS[engine])
        return 0
    args, unknown = _parser(engine).parse_known_args(rest)
    print(f"INFO {engine} {VERSIONS[engine]} (fake) args: {' '.join(rest)}", flush=True)
    if unknown:
        print(f"WARNING ignoring arguments the fake does not know: {unknown}", flush=True)
    if engine == "vllm" and args.lora_modules and not args.enable_lora:
        print("ValueError: --lora-modules needs --enable-lora", flush=True)
        return 1
    if engine == "vllm" and not 1 <= args.max_loras <= 256:
        print(f"ValueError: max_loras ({args.max_loras}) must be between 1 and 256", flush=True)
        return 1
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        # What both say when the directory is not a model: exit 1 with the reason.
        print(f"ValueError: No config.json found in {model_dir}: not a model directory", flush=True)
        return 1
    key = os.environ.get("VLLM_API_KEY") if engine == "vllm" else args.api_key
    trio.run(_serve, engine, args, key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
