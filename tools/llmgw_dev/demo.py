"""The quick-start demo: a real llama-server on the tiny model, llmgw-control in front of it.

Sends one chat completion through the gateway, prints how to call it, and keeps serving until
Ctrl-C, which stops the gateway gracefully and the engine with it.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from llmgw_dev import build_engine
from llmgw_dev.engine_proc import free_port, llama_server_process
from llmgw_dev.tiny_model import ensure_model


def port_or_free(port: int) -> int:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return port
        except OSError:
            return free_port()


def wait_healthy(url: str, process: subprocess.Popen[bytes], deadline: float = 30) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if process.poll() is not None:
            raise SystemExit(f"llmgw-control exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise SystemExit("llmgw-control did not become healthy")


def chat(url: str) -> dict[str, object]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello, llmgw!"}], "max_tokens": 24}
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        result: dict[str, object] = json.load(response)
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080, help="client API port (a free one if taken)")
    args = parser.parse_args(argv)
    binary = build_engine.server_binary()
    model = ensure_model()
    api_port = port_or_free(args.port)
    admin_port = port_or_free(api_port + 1)
    api = f"http://127.0.0.1:{api_port}"
    control = str(Path(sys.executable).with_name("llmgw-control"))
    with llama_server_process(binary, model, alias="tiny") as engine:
        print(f"[demo] llama-server (build {build_engine.BUILD_NUMBER}) on {engine.url} serving {model.name}")
        gateway = subprocess.Popen([control, "run", "--listen", f"127.0.0.1:{api_port}",
                                    "--admin-listen", f"127.0.0.1:{admin_port}",
                                    "--endpoint", f"local={engine.url}=tiny", "--log-format", "text"])
        try:
            wait_healthy(api, gateway)
            reply = chat(api)
            choices = reply["choices"]
            assert isinstance(choices, list)
            print("\n[demo] one chat completion through llmgw:")
            print(f"  reply: {choices[0]['message']['content']!r}")
            print(f"  usage: {reply['usage']}")
            print(f"""
[demo] llmgw is serving the OpenAI API on {api}/v1 (metrics: http://127.0.0.1:{admin_port}/metrics)

  curl {api}/v1/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "tiny", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 16}}'

  from openai import OpenAI
  client = OpenAI(base_url="{api}/v1", api_key="none")
  reply = client.chat.completions.create(model="tiny", max_tokens=16,
                                         messages=[{{"role": "user", "content": "hi"}}])
  print(reply.choices[0].message.content)

  (the tiny model has random weights: it answers in fluent gibberish)
  Press Ctrl-C to stop.
""", flush=True)
            gateway.wait()
        except KeyboardInterrupt:
            print("\n[demo] stopping", flush=True)
        finally:
            if gateway.poll() is None:
                gateway.send_signal(signal.SIGTERM)
                try:
                    gateway.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    gateway.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
