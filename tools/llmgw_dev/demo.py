"""The quick-start demo: llmgw-control and one llmgw-node on this machine, a real engine, a real model.

Control serves the llama-server release archive and the model file to the node (as it would in
an air-gapped cluster), the node installs and proves the engine, and the first chat completion
starts the model (a cold start). The model is SmolLM2-135M-Instruct (``smollm2.py``: from PyPI's
wheel, sha256 pinned), small enough for one CPU thread and real enough to answer a question; the
tiny random model stays for the fast tests. Then it keeps serving until Ctrl-C, which stops the daemons
and the engine with them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import tomli_w

from llmgw_dev import build_engine, smollm2
from llmgw_dev.engine_proc import free_port
from llmgw_dev.served_files import place

BIN = Path(sys.executable).parent
# The demo's first request and printed example: a question with one right answer.
QUESTION = "What is the capital of France?"


def port_or_free(port: int) -> int:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return port
        except OSError:
            return free_port()


def wait_healthy(url: str, process: subprocess.Popen[bytes], what: str, deadline: float = 60) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if process.poll() is not None:
            raise SystemExit(f"[demo] {what} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise SystemExit(f"[demo] {what} did not become healthy")


class DemoError(Exception):
    """Something the demo cannot get past, said in one line (never a traceback)."""


def post_json(
    url: str, body: dict[str, object] | None, timeout: float = 300, headers: dict[str, str] | None = None
) -> dict[str, object]:
    """POST ``body`` (GET when None); the JSON answer, or DemoError with the server's own message."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            result: dict[str, object] = json.load(response)
            return result
    except urllib.error.HTTPError as exc:
        raise DemoError(f"{request.get_method()} {url} answered {exc.code}: {_message(exc)}") from None
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
        raise DemoError(f"{request.get_method()} {url} failed: {exc}") from None


def _message(error: urllib.error.HTTPError) -> str:
    try:
        body = json.load(error)
        found = body.get("error", body) if isinstance(body, dict) else body
        return str(found.get("message", found) if isinstance(found, dict) else found)[:300]
    except (ValueError, OSError):
        return error.reason or ""


def demo_key(api: str, admin: str) -> dict[str, str]:
    """The headers for the demo's own requests: none while the gateway is open, else a key of its own.

    Keys created between two runs (docs/admin-api.md shows how) close the gateway to requests
    without one; the demo then makes itself a key through the admin API (on loopback, open by
    default) rather than failing on its own first request.
    """
    try:
        post_json(api + "/v1/models", None, timeout=10)
        return {}
    except DemoError as exc:
        if " answered 401" not in str(exc):
            raise
    groups = post_json(admin + "/api/v1/groups", None, timeout=10)["groups"]
    assert isinstance(groups, list)
    group = (
        next((g for g in groups if isinstance(g, dict) and g.get("name") == "demo" and not g.get("parent_id")), None)
        or post_json(admin + "/api/v1/groups", {"name": "demo"}, timeout=10)["group"]
    )
    assert isinstance(group, dict)
    name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    created = post_json(admin + "/api/v1/keys", {"name": name, "group_id": group["id"]}, timeout=10)
    print(
        f"[demo] this gateway has API keys now (made since the last run), so the demo made one of its own: "
        f"{name} in group 'demo'",
        flush=True,
    )
    return {"authorization": f"Bearer {created['secret']}"}


def join_token(root: Path) -> str:
    """The demo fleet's shared join token, made once and kept (0600) beside its configs."""
    path = root / "join-token"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text("llmgw-join-" + secrets.token_urlsafe(32))
    return path.read_text().strip()


def prepare(root: Path, model: Path, archive: Path, ports: dict[str, int]) -> tuple[Path, Path]:
    files = root / "files"
    for kind, source in (("engines", archive), ("models", model)):
        # In the tree (a hard link, else a copy): control serves nothing whose real path leaves it.
        (files / kind / source.name).unlink(missing_ok=True)
        place(source, files / kind / source.name)
    agents = f"http://127.0.0.1:{ports['agents']}"
    # The fleet is closed, as in production: the node joins with a shared token whose digest
    # control's config lists (`llmgw-control join-token` makes such a pair).
    token = join_token(root)
    digest = "sha256:" + hashlib.sha256(token.encode()).hexdigest()
    control = {
        "listen": f"127.0.0.1:{ports['api']}",
        "admin_listen": f"127.0.0.1:{ports['admin']}",
        "data_dir": str(root / "control"),
        "log_format": "text",
        "agents": {"listen": f"127.0.0.1:{ports['agents']}", "files_dir": str(files), "join_token_digests": [digest]},
        # One thread: the demo shares the machine; SmolLM2 answers a short question in about a second.
        "models": [
            {
                "name": smollm2.MODEL_NAME,
                "profiles": [
                    {
                        "name": "cpu",
                        "context": 2048,
                        "parallel": 2,
                        "args": ["-t", "1", *smollm2.ENGINE_ARGS],
                        "weights": {
                            "url": f"{agents}/files/models/{model.name}",
                            "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                            "size": model.stat().st_size,
                        },
                    }
                ],
            }
        ],
    }
    node = {
        "control": [f"ws://127.0.0.1:{ports['agents']}/agent/v1"],
        "node_id": "demo-node",
        "token": token,
        "data_dir": str(root / "node"),
    }
    (root / "control.toml").write_text(tomli_w.dumps(control))
    # The node's config holds its token: readable by its owner only, as the installer leaves it.
    node_toml = root / "node.toml"
    node_toml.touch(mode=0o600)
    node_toml.chmod(0o600)
    node_toml.write_text(tomli_w.dumps(node))
    return root / "control.toml", root / "node.toml"


def start(command: list[str]) -> subprocess.Popen[bytes]:
    """A daemon in a process group of its own: Ctrl-C in the terminal reaches only the demo, which
    then hands each daemon one SIGTERM. In the terminal's group each would get the SIGINT too,
    and the SIGTERM after it would be a second signal ("out now"), not a graceful stop."""
    return subprocess.Popen(command, process_group=0)


def stop(process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080, help="client API port (a free one if taken)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the configs and the daemons' state go (default: the cache's demo/)",
    )
    args = parser.parse_args(argv)
    archive = build_engine.ensure_engine()
    model = smollm2.ensure_model()
    ports = {"api": port_or_free(args.port)}
    ports["admin"] = port_or_free(ports["api"] + 1)
    ports["agents"] = port_or_free(ports["api"] + 10)
    root = args.dir or build_engine.cache_dir() / "demo"
    shutil.rmtree(root / "node" / "state", ignore_errors=True)
    control_toml, node_toml = prepare(root, model, archive, ports)
    api = f"http://127.0.0.1:{ports['api']}"
    # SIGTERM to the demo (its own kill, a CI job's timeout) stops the daemons as Ctrl-C does:
    # they are in groups of their own, so nothing else would. SIGINT too, explicitly: a program a
    # script starts in the background inherits SIGINT ignored, and Python then leaves it ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    control = start([str(BIN / "llmgw-control"), "run", "--config", str(control_toml)])
    node = None
    failed = False
    try:
        wait_healthy(api, control, "llmgw-control")
        node = start([str(BIN / "llmgw-node"), "run", "--config", str(node_toml), "--stop-engines"])
        print(
            "\n[demo] control and node are up; the first request starts the model on the node "
            "(install the engine, fetch the weights, start llama-server)...",
            flush=True,
        )
        started = time.monotonic()
        key = demo_key(api, f"http://127.0.0.1:{ports['admin']}")
        reply = post_json(
            api + "/v1/chat/completions",
            {
                "model": "smollm2",
                "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": 48,
                "temperature": 0,
            },
            headers=key,
        )
        took = time.monotonic() - started
        choices = reply["choices"]
        assert isinstance(choices, list)
        print(f"\n[demo] one chat completion through llmgw ({took:.1f} s, cold start included):")
        print(f"  question: {QUESTION!r}")
        print(f"  answer:   {choices[0]['message']['content']!r}")
        print(f"  usage: {reply['usage']}")
        print(
            f"""
[demo] llmgw is serving the OpenAI API on {api}/v1
  dashboard: http://127.0.0.1:{ports["admin"]}/  (nodes, models, replicas, keys; open on loopback)
  admin API and metrics: http://127.0.0.1:{ports["admin"]}/api/v1/nodes, /api/v1/models, /metrics

  curl {api}/v1/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "smollm2", "temperature": 0, "messages": [{{"role": "user", "content": "{QUESTION}"}}]}}'

  from openai import OpenAI
  client = OpenAI(base_url="{api}/v1", api_key="none")
  reply = client.chat.completions.create(model="smollm2", temperature=0,
                                         messages=[{{"role": "user", "content": "{QUESTION}"}}])
  print(reply.choices[0].message.content)   # {choices[0]["message"]["content"]}

  (SmolLM2 has 135M parameters: right about simple facts, not much more)
  Press Ctrl-C to stop.
""",
            flush=True,
        )
        control.wait()
    except KeyboardInterrupt:
        print("\n[demo] stopping", flush=True)
    except DemoError as exc:
        print(f"\n[demo] {exc}; stopping", file=sys.stderr, flush=True)
        failed = True
    finally:
        # A second Ctrl-C must not cut the stop short and leave a daemon behind: stop() bounds it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if node is not None:
            stop(node)
        stop(control)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
