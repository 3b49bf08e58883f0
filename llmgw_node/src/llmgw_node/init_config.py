"""``llmgw-node init``: a commented config with every option; ``--check`` validates one.

Generated from ``NodeConfig`` (see ``llmgw_shared.config_doc``) with the one-line help in
``DOCS``; a test fails when an option has none. The onboarding script uses this command to
write ``/etc/llmgw/node.toml``, so an onboarded node's file documents itself too.

The join token is read from ``--token-file`` or the ``LLMGW_JOIN_TOKEN`` environment variable,
never from a flag: a command line is visible to every user in ``ps``.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import attrs

from llmgw_shared.config import ConfigError
from llmgw_shared.config_doc import render, write_output

from .config import ConfiguredEngine, NodeConfig, load_config, parse_config

TOKEN_ENV = "LLMGW_JOIN_TOKEN"

DOCS: dict[str, str] = {
    "NodeConfig.control": "Control agent URLs (ws:// or wss://, path /agent/v1), tried in order; list every "
    "control daemon so a failover finds the leader.",
    "NodeConfig.token": "The join token control gave this node (llmgw-control ctl nodes add); keep this file private.",
    "NodeConfig.node_id": "This node's name in the fleet.",
    "NodeConfig.data_dir": "Engines, model weights and state live here.",
    "NodeConfig.engine_host": "Address engines listen on, and the one control is told to reach them at.",
    "NodeConfig.address": "Address control should use for this node's engines, when not engine_host "
    "(NAT, a second interface).",
    "NodeConfig.allow_os_packages": "Let engine installs apt-get the OS libraries a build needs (needs root; "
    "otherwise the failure names the package to install).",
    "NodeConfig.release_signing_keys": "minisign public keys: when set, every engine release index must be "
    "signed by one (<index URL>.minisig).",
    "NodeConfig.keep_engine_archives": "Keep engine archives beside each install so `engines check` verifies "
    "their digests again.",
    "NodeConfig.engine_backend": 'llama.cpp build to install: "" chooses by the devices (NVIDIA: cuda, AMD: rocm, '
    'other GPUs: vulkan, else cpu); "cuda", "rocm", "vulkan" or "cpu" pins it.',
    "NodeConfig.tls_ca_file": "For wss://: the CA that signed control's certificate (empty: the system's CAs).",
    "NodeConfig.tls_cert_file": "For mutual TLS: this node's client certificate (PEM).",
    "NodeConfig.tls_key_file": "For mutual TLS: this node's client key (PEM).",
    "NodeConfig.engines": "Engines that are not release archives (vLLM, SGLang, a local build), named by path.",
    "NodeConfig.model_roots": "Where vLLM/SGLang model directories may be, besides <data_dir>/models and hub_cache.",
    "NodeConfig.hub_cache": "The Hugging Face Hub cache hub:ORG/NAME model_dirs are found in (empty: <data_dir>/hub).",
    "NodeConfig.recheck_interval_s": "Seconds between re-checks of installed engines (ldd and --version).",
    "NodeConfig.unpack_max_bytes": "Most bytes one engine archive may unpack to (default 8 GiB: 4x llama.cpp's "
    "CUDA builds).",
    "NodeConfig.unpack_max_entries": "Most entries one engine archive may hold (default 4096: 100x llama.cpp's "
    "archives).",
    "NodeConfig.install_retry_min_s": "First delay before a failed engine install is tried again (doubles).",
    "NodeConfig.install_retry_max_s": "Longest delay between attempts at a failed engine install.",
    "NodeConfig.reconnect_min_s": "First delay before reconnecting to control (doubles, with jitter).",
    "NodeConfig.reconnect_max_s": "Longest delay between reconnect attempts.",
    "NodeConfig.log_level": "debug, info, warning or error.",
    "NodeConfig.tracing": "OpenTelemetry traces of engine installs and replica starts, sent to an OTLP collector "
    '(docs/operator-guide.md, "Traces").',
    "ConfiguredEngine.name": "Engine name, as control's profiles name it (e.g. vllm).",
    "ConfiguredEngine.path": "The engine's executable.",
    "ConfiguredEngine.version": "Version reported to control (empty: the line --version prints).",
    "ConfiguredEngine.version_args": "Arguments that make it print its version and exit.",
}

HEADER = """\
llmgw-node configuration, written by `llmgw-node init`.

Every option is listed with a one-line description and its default. Check a file with
`llmgw-node init --check FILE`; run with `llmgw-node run --config FILE`.
Reference: docs/node.md and docs/operator-guide.md."""

EXAMPLES: dict[str, list[Any]] = {
    "engines": [ConfiguredEngine(name="vllm", path="/opt/vllm/bin/vllm", version="0.11.0")],
}


def render_config(config: NodeConfig | None = None) -> str:
    return render(config or NodeConfig(), DOCS, header=HEADER, examples=EXAMPLES)


def check(path: str) -> int:
    """Validate ``path`` exactly as ``run`` does before it starts; the daemon's message on failure."""
    from .tls import client_context

    try:
        config = load_config(path)
        # run refuses unreadable certificates before starting: so does the check.
        client_context(config)
    except ConfigError as exc:
        print(f"llmgw-node: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: ok")
    return 0


def _token(token_file: str | None) -> str:
    if token_file:
        return Path(token_file).read_text().strip()
    return os.environ.get(TOKEN_ENV, "").strip()


def build(*, control: list[str], node_id: str | None, data_dir: str | None, token_file: str | None) -> NodeConfig:
    changes: dict[str, Any] = {}
    if control:
        changes["control"] = control
    if node_id:
        changes["node_id"] = node_id
    if data_dir:
        changes["data_dir"] = data_dir
    token = _token(token_file)
    if token:
        changes["token"] = token
    return attrs.evolve(NodeConfig(), **changes)


def write(text: str, output: str | None, *, force: bool, private: bool) -> int:
    # A file holding a join token is readable by its owner only (the installer then hands it to
    # the daemon's group).
    return write_output(text, output, force=force, mode=0o600 if private else 0o644, program="llmgw-node")


def main(
    output: str | None,
    *,
    force: bool,
    check_path: str | None,
    control: list[str],
    node_id: str | None,
    data_dir: str | None,
    token_file: str | None,
) -> int:
    if check_path:
        return check(check_path)
    try:
        config = build(control=control, node_id=node_id, data_dir=data_dir, token_file=token_file)
    except OSError as exc:
        print(f"llmgw-node: cannot read the token file: {exc}", file=sys.stderr)
        return 2
    text = render_config(config)
    # What init writes must load: a bad --control URL is refused now, not at the first start.
    try:
        parse_config(tomllib.loads(text), source="init")
    except ConfigError as exc:
        print(f"llmgw-node: {exc}", file=sys.stderr)
        return 2
    return write(text, output, force=force, private=bool(config.token))
