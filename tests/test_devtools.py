"""The developer tools other tests stand on: the tiny model, the real engines, the fake engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import trio

from llmgw_dev import tiny_model as tm
from llmgw_dev.engine_proc import EngineStartError, LlamaServer, llama_server_process, running_llama_server
from llmgw_dev.fake_engine import FakeEngine, FakeEngineBehavior, run_fake_engine

# --- the tiny model ---------------------------------------------------------------------------


def test_tiny_model_is_byte_identical_across_writes(tmp_path: Path, tiny_model: Path) -> None:
    first = tm.write_model(tmp_path / "a" / "m.gguf").read_bytes()
    second = tm.write_model(tmp_path / "b" / "m.gguf").read_bytes()
    assert first == second
    assert tiny_model.read_bytes() == first  # the cached copy is the same model
    assert 200_000 < len(first) < 400_000


def test_tiny_model_vocabulary_shape() -> None:
    tokens, types, merges = tm.vocabulary()
    assert len(tokens) == tm.N_VOCAB == len(types)
    assert tokens[-3:] == list(tm.CONTROL_TOKENS) and types[-3:] == [3, 3, 3]
    assert len(merges) == tm.N_MERGES
    # every merge joins two tokens that exist earlier in the list (llama.cpp refuses otherwise)
    for i, merge in enumerate(merges):
        a, b = merge.split(" ")
        assert tokens.index(a) < 256 + i and tokens.index(b) < 256 + i


# --- the real engine --------------------------------------------------------------------------


def _client(server: LlamaServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_real_engine_chat(real_engine: LlamaServer) -> None:
    reply = _client(real_engine).chat.completions.create(
        model="anything", messages=[{"role": "user", "content": "Hello there"}], max_tokens=12
    )
    assert reply.model == "tiny"
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    text = choice.message.content or ""
    assert text and text.isprintable() and text.isascii()  # the printable-bias trick works
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens > 3


def test_real_engine_streams_with_usage(real_engine: LlamaServer) -> None:
    stream = _client(real_engine).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 16  # one chunk per token
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finish] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16


def test_real_embedding_engine(real_embedding_engine: LlamaServer) -> None:
    result = _client(real_embedding_engine).embeddings.create(
        model="tiny-embed", input=["hello world", "the quick brown fox"]
    )
    assert [d.index for d in result.data] == [0, 1]
    assert all(len(d.embedding) == tm.N_EMBD for d in result.data)
    assert result.data[0].embedding != result.data[1].embedding
    assert result.usage.prompt_tokens > 0


def test_real_chat_engine_has_no_embeddings(real_engine: LlamaServer) -> None:
    # What a gateway sees when it sends embeddings to a chat-only replica.
    with pytest.raises(openai.APIStatusError) as caught:
        _client(real_engine).embeddings.create(model="tiny", input="hi")
    assert caught.value.status_code == 501
    assert "not_supported_error" in caught.value.response.text


async def test_running_llama_server_stops_its_process_group(llama_server_binary: Path, tiny_model: Path) -> None:
    async with running_llama_server(llama_server_binary, tiny_model, alias="t2", api_key="k") as srv:
        async with httpx2.AsyncClient(timeout=10) as client:
            denied = await client.get(f"{srv.url}/v1/models")
            assert denied.status_code == 401
            ok = await client.get(f"{srv.url}/v1/models", headers={"Authorization": "Bearer k"})
            assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "t2"
        pid = srv.pid
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_llama_server_that_cannot_start_reports_its_log(llama_server_binary: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but not really")
    with (
        pytest.raises(EngineStartError, match="exited with") as caught,
        llama_server_process(llama_server_binary, broken, alias="broken"),
    ):
        pass
    assert "broken.gguf" in str(caught.value)  # the log tail says what went wrong


# --- the fake engine --------------------------------------------------------------------------


def _events(body: str) -> list[Any]:
    out: list[Any] = []
    for line in body.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_fake_chat_non_streaming_and_observation(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.chunks = 3
    fake_engine.behavior.prompt_tokens = 11
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client:
        resp = await client.post(
            "/v1/chat/completions", json={"model": "fake-model", "messages": []}, headers={"x-request-id": "req-123"}
        )
    assert resp.status_code == 200
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    [seen] = fake_engine.observed.requests
    assert (seen.path, seen.request_id) == ("/v1/chat/completions", "req-123")
    assert seen.json["model"] == "fake-model"
    assert seen.headers["x-request-id"] == "req-123"


async def test_fake_stream_is_shaped_like_llama_cpp(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.chunks = 4
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": "fake-model", "stream": True, "stream_options": {"include_usage": True}},
        )
    events = _events(resp.text)
    assert resp.headers["content-type"] == "text/event-stream"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [e["choices"][0]["delta"]["content"] for e in events[1:5]] == ["tok0 ", "tok1 ", "tok2 ", "tok3 "]
    assert events[5]["choices"][0]["finish_reason"] == "length"
    assert events[6]["choices"] == [] and events[6]["usage"]["completion_tokens"] == 4
    assert events[7] == "[DONE]" and len(events) == 8
    # the handler counts a stream after its last write, which can land after the client has read it
    with trio.fail_after(5):
        await fake_engine.observed.wait_for(lambda o: o.completed_streams == 1)
    assert fake_engine.observed.disconnects == []  # a client that read everything did not go away


async def test_fake_stream_without_usage_and_completions(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.chunks = 2
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client:
        chat = _events((await client.post("/v1/chat/completions", json={"stream": True})).text)
        text = _events((await client.post("/v1/completions", json={"stream": True, "prompt": "x"})).text)
    assert all("usage" not in e for e in chat[:-1]) and len(chat) == 5
    assert [e["choices"][0]["text"] for e in text[:2]] == ["tok0 ", "tok1 "]
    assert text[2]["usage"]["completion_tokens"] == 2  # llama.cpp: usage on the finish chunk


async def test_fake_models_embeddings_metrics(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.models = ["a", "b"]
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client:
        models = (await client.get("/v1/models")).json()
        emb = (await client.post("/v1/embeddings", json={"model": "b", "input": ["x", "y"]})).json()
        await client.post("/v1/chat/completions", json={"model": "b"})
        metrics = (await client.get("/metrics")).text
    assert [m["id"] for m in models["data"]] == ["a", "b"]
    assert emb["model"] == "b" and [len(d["embedding"]) for d in emb["data"]] == [8, 8]
    assert emb["data"][0]["embedding"] != emb["data"][1]["embedding"]
    assert "llamacpp:tokens_predicted_total 8" in metrics
    assert "llamacpp:requests_processing 0" in metrics


async def test_fake_status_before_body_for_n_requests(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.status_before_body = 503
    fake_engine.behavior.status_times = 2
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client:
        statuses = [(await client.post("/v1/chat/completions", json={"stream": True})).status_code for _ in range(3)]
        fake_engine.behavior.status_times = None
        failed = await client.post("/v1/chat/completions", json={})
    assert statuses == [503, 503, 200]
    assert failed.status_code == 503 and failed.json()["error"]["type"] == "unavailable_error"


async def test_fake_requires_api_key(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.api_key = "sekret"
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.post("/v1/chat/completions", json={})).status_code == 401
        ok = await client.post("/v1/chat/completions", json={}, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200


async def test_fake_close_mid_stream_truncates(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.chunks = 10
    fake_engine.behavior.close_mid_stream_after = 3
    received = b""
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            async with client.stream("POST", "/v1/chat/completions", json={"stream": True}) as resp:
                async for part in resp.aiter_bytes():
                    received += part
    assert received.count(b'"content":"tok') == 3 and b"[DONE]" not in received
    assert fake_engine.observed.completed_streams == 0


async def test_fake_observes_client_disconnect_mid_stream(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.chunks = 10
    fake_engine.behavior.hang_mid_stream_after = 2
    async with (
        httpx2.AsyncClient(base_url=fake_engine.url) as client,
        client.stream(
            "POST", "/v1/chat/completions", json={"stream": True}, headers={"x-request-id": "gone-1"}
        ) as resp,
    ):
        async for line in resp.aiter_lines():
            if '"tok1 "' in line:
                break  # then leave the block: httpx closes the connection
    with trio.fail_after(5):
        [gone] = await fake_engine.observed.wait_disconnects(1)
    assert (gone.phase, gone.chunks_sent, gone.request_id) == ("mid_stream", 2, "gone-1")
    assert fake_engine.observed.in_flight == 0


async def test_fake_observes_disconnect_before_first_byte(fake_engine: FakeEngine) -> None:
    fake_engine.behavior.hang_before_first_byte = True
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client, trio.open_nursery() as nursery:

        async def call() -> None:
            await client.post("/v1/chat/completions", json={})

        nursery.start_soon(call)
        with trio.fail_after(5):
            await fake_engine.observed.wait_in_flight(1)
        nursery.cancel_scope.cancel()  # the client gives up: its connection is closed
    with trio.fail_after(5):
        [gone] = await fake_engine.observed.wait_disconnects(1)
    assert gone.phase == "before_first_byte" and gone.chunks_sent == 0


async def test_fake_keeps_connections_alive_unless_told(fake_engine: FakeEngine) -> None:
    async with httpx2.AsyncClient(base_url=fake_engine.url) as client:
        for stream in (False, True, False, True):
            resp = await client.post("/v1/chat/completions", json={"stream": stream})
            assert resp.status_code == 200 and (not stream or resp.text.endswith("data: [DONE]\n\n"))
        assert fake_engine.observed.connections == 1
        # llama-server closes the connection after every stream: the fake can do the same
        fake_engine.behavior.close_after_stream = True
        for _ in range(2):
            resp = await client.post("/v1/chat/completions", json={"stream": True})
            assert resp.headers["connection"] == "close"
        await client.post("/v1/chat/completions", json={})
    assert fake_engine.observed.connections == 3


async def test_fake_delays_are_applied() -> None:
    behavior = FakeEngineBehavior(chunks=3, first_byte_delay=0.2, chunk_delay=0.05)
    async with run_fake_engine(behavior) as engine, httpx2.AsyncClient(base_url=engine.url) as client:
        start = trio.current_time()
        await client.post("/v1/chat/completions", json={"stream": True})
        elapsed = trio.current_time() - start
    assert 0.35 <= elapsed < 2.0


def test_fake_engine_runs_as_a_process() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "tools")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw_dev.fake_engine", "--port", "0", "--chunks", "2", "--model", "m1"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        resp = httpx2.post(f"{url}/v1/chat/completions", json={"model": "m1"}, timeout=10)
        assert resp.json()["choices"][0]["message"]["content"] == "tok0 tok1 "
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0  # SIGTERM is a clean shutdown, not a kill


# --- the benchmark's load generator -----------------------------------------------------------


def _bench_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("llmgw_bench_run", Path(__file__).parent.parent / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_bench_load_generator_counts_only_complete_answers(fake_engine: FakeEngine) -> None:
    bench = _bench_module()
    fake_engine.behavior.chunks = 32
    for stream in (False, True):
        good = await bench.run_load(fake_engine.url, stream=stream, concurrency=4, requests=40, seconds=10)
        assert (good.requests, good.errors, len(good.latencies)) == (40, 0, 40)
    # a truncated stream is an error, not a fast success
    fake_engine.behavior.close_mid_stream_after = 5
    bad = await bench.run_load(fake_engine.url, stream=True, concurrency=2, requests=10, seconds=10)
    assert (bad.requests, bad.errors) == (0, 10)
    # and llama-server's habit of closing after each stream costs reconnects, not errors
    fake_engine.behavior.close_mid_stream_after = None
    fake_engine.behavior.close_after_stream = True
    reconnecting = await bench.run_load(fake_engine.url, stream=True, concurrency=2, requests=10, seconds=10)
    assert (reconnecting.requests, reconnecting.errors) == (10, 0)


async def test_bench_load_generator_spreads_over_several_urls(fake_engine: FakeEngine) -> None:
    bench = _bench_module()
    done = await bench.run_load(
        [fake_engine.url, fake_engine.url], stream=False, concurrency=4, requests=20, seconds=10
    )
    assert (done.requests, done.errors) == (20, 0)


def _scale_module() -> Any:
    import importlib.util
    import sys

    bench_dir = Path(__file__).parent.parent / "bench"
    if str(bench_dir) not in sys.path:
        sys.path.insert(0, str(bench_dir))  # scale.py imports the load generator from run.py
    spec = importlib.util.spec_from_file_location("llmgw_bench_scale", bench_dir / "scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stat_line(pid: int, name: str, ppid: int, utime: int, stime: int) -> str:
    # Fields 3.. of /proc/<pid>/stat: state, ppid, then 9 more before utime (14) and stime (15).
    return f"{pid} ({name}) S {ppid} " + "0 " * 9 + f"{utime} {stime} 0 0 20 0 1 0"


def test_bench_parses_proc_stat_with_a_hostile_process_name() -> None:
    scale = _scale_module()
    assert scale.parse_stat(_stat_line(7, "a) S 99 (b", 3, 120, 30)) == (3, 150)


def test_bench_sums_cpu_over_a_process_tree(tmp_path: Path) -> None:
    scale = _scale_module()
    tree = {10: (1, 100, 0), 11: (10, 40, 10), 12: (10, 5, 5), 13: (11, 1, 1), 20: (1, 999, 999)}
    for pid, (ppid, utime, stime) in tree.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat_line(pid, "llmgw-control", ppid, utime, stime))
    (tmp_path / "self").mkdir()  # not a pid: skipped
    expected = (100 + 50 + 10 + 2) / scale.CLK_TCK  # 10 and its descendants; 20 is not one
    assert scale.tree_cpu_seconds(10, proc=tmp_path) == expected


# --- the dependency tiers ---------------------------------------------------------------------


def test_the_tiers_resolve_every_direct_range_but_our_own_packages() -> None:
    from llmgw_dev import deps

    wanted = deps.requirements()
    names = {deps._name(r) for r in wanted}
    assert not names & deps.OUR_DISTRIBUTIONS
    # The ranges as written, upper bounds included: the newest tier must honour them.
    assert any(r.startswith("httpcore2[trio]>=") and "<" in r for r in wanted)
    assert {"trio", "hypercorn", "pytest", "hypothesis", "huggingface-hub"} <= names
    assert deps.venv_for("lock").name == ".venv" and deps.venv_for("newest").name == ".venv-newest"


# --- the demo, as a newcomer uses it ------------------------------------------------------------


async def test_the_demo_makes_its_own_key_once_the_gateway_has_keys(fake_engine: FakeEngine) -> None:
    # Issue 33: a key created through the admin API between two runs closed the gateway to the
    # demo's own first request, and the demo died with a traceback (HTTP Error 401).
    from llmgw_dev import demo
    from support.gateway import endpoint, running_gateway

    async with running_gateway(endpoint("e1", fake_engine.url)) as gw:
        api, admin = gw.listening.api_url, gw.listening.admin_url
        assert await trio.to_thread.run_sync(demo.demo_key, api, admin) == {}  # open: no key needed
        async with httpx2.AsyncClient(base_url=admin + "/api/v1") as client:
            group = (await client.post("/groups", json={"name": "team"})).json()["group"]
            assert (await client.post("/keys", json={"name": "mine", "group_id": group["id"]})).status_code == 201
        for _ in range(2):  # and again on the next run: the demo's group is found, not made twice
            headers = await trio.to_thread.run_sync(demo.demo_key, api, admin)
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
            reply = await trio.to_thread.run_sync(
                partial(demo.post_json, api + "/v1/chat/completions", body, headers=headers)
            )
            assert reply["choices"]
        with pytest.raises(demo.DemoError, match="answered 401"):  # one line, never a traceback
            await trio.to_thread.run_sync(lambda: demo.post_json(api + "/v1/chat/completions", body))
