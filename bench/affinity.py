"""Cache-aware routing against least-loaded, on real engines: what prefix affinity buys and costs.

    .venv/bin/python bench/affinity.py --quick          # ~3 minutes: 8 conversations, 16 unique prompts
    .venv/bin/python bench/affinity.py                  # the recorded run (docs/performance.md)

Two real llama-server replicas of SmolLM2-135M-Instruct (``tools/llmgw_dev/smollm2.py``), one
thread each (``-t 1``), four slots each, behind ``llmgw-control run`` as a process with the two as
static endpoints (four gateway slots each, so requests queue in the gateway, not in an engine).
Each (workload, routing) phase gets *fresh* engines, so no phase inherits another's KV cache; the
routing modes alternate within a round, and ``--rounds`` repeats the pair.

- **multi-turn**: ``--conversations`` conversations of ``--turns`` turns, all sharing one system
  prompt of several hundred tokens, each opening with its own question; ``--concurrency``
  conversations at a time, each turn sent after the previous answer arrived (with that answer in
  the history) and a think time (``--think``, uniform in 0.5 to 1.5 times its mean: a person reading the
  answer and typing), as a chat user does. Without think time the run is a closed loop that makes
  least-loaded routing accidentally sticky: the replica that has just answered a conversation is,
  at that instant, the least loaded one, so the same client's next turn goes back to it (measured:
  every later turn of every conversation found its whole history cached under least-loaded with
  ``--think 0``, and turns switched replicas half the time with ``--think 1``).
- **unique**: ``--unique`` requests, each with its own random system prompt of ~150 tokens: nothing
  to share, so affinity can only cost (an uneven spread of keys) and never help.

Every request is streamed with ``include_usage``; measured per request: time to the first content
delta (TTFT, client side, so it includes the gateway), the prompt tokens and those the engine took
from its cache (``usage.prompt_tokens_details.cached_tokens``); per phase: requests/s over the
phase's wall time, and the gateway's affinity hits and misses from its /metrics.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx2
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from llmgw_dev import build_engine, smollm2  # noqa: E402
from llmgw_dev.engine_proc import free_port, llama_server_process  # noqa: E402

MODEL = "smollm2"
# Four slots of 2048 tokens: a whole conversation (system prompt ~450 tokens, turns of ~50) fits a
# slot, and four conversations run on a replica at once, as four gateway slots send.
ENGINE_ARGS = (*smollm2.ENGINE_ARGS, "-c", "8192", "-np", "4")
SLOTS = 4
# The shared system prompt: several hundred tokens (~450 with SmolLM2's tokenizer), the kind of
# preamble a product puts before every conversation.
SYSTEM_PROMPT = " ".join(
    [
        "You are Atlas, the support assistant of a company that sells hiking and camping equipment.",
        "Answer briefly and politely. Never invent prices, stock levels or delivery dates.",
        "If a customer asks about an order, ask for the order number, which has eight digits.",
        "Returns are accepted within sixty days for unused items and within thirty days for used ones.",
        "Tents carry a two-year warranty against manufacturing faults; sleeping bags carry one year.",
        "Stoves must never be used inside a tent; say so whenever a customer mentions cooking in one.",
        "Recommend a lighter backpack to customers who hike more than twenty kilometres a day.",
        "For questions about rain gear, explain the difference between water-resistant and waterproof.",
        "Do not discuss competitors. Do not give medical advice; suggest a doctor instead.",
        "Customers in the mountains may have poor connections: keep answers short and plain.",
    ]
    * 3
)
TOPICS = [
    "tents",
    "sleeping bags",
    "stoves",
    "backpacks",
    "rain jackets",
    "boots",
    "water filters",
    "headlamps",
    "trekking poles",
    "maps",
    "first aid kits",
    "camping chairs",
]
FOLLOW_UPS = [
    "Can you say more about that?",
    "What would you recommend for a beginner?",
    "Is there anything I should avoid?",
    "How do I look after it?",
    "Thanks. One last thing: the warranty?",
]
WORDS = [
    "river",
    "stone",
    "cloud",
    "pine",
    "ridge",
    "lantern",
    "meadow",
    "canyon",
    "glacier",
    "harbor",
    "orchard",
    "ember",
    "valley",
    "prairie",
    "summit",
    "thicket",
    "compass",
    "willow",
    "granite",
    "tundra",
]


@attrs.define
class Sample:
    ttft: float
    prompt_tokens: int
    cached_tokens: int
    # Where the time went, for --samples: the turn (0 for a unique prompt), the replica that
    # served (x-llmgw-replica), the gateway's queueing and the engine's own prompt time.
    turn: int = 0
    conversation: int = -1
    replica: str = ""
    queued_ms: float = 0.0
    prompt_ms: float | None = None


@attrs.define
class Phase:
    workload: str
    routing: str
    samples: list[Sample]
    seconds: float
    errors: int
    hits: float
    misses: float

    def summary(self) -> dict[str, Any]:
        ttfts = sorted(s.ttft for s in self.samples)
        prompt = sum(s.prompt_tokens for s in self.samples)
        cached = sum(s.cached_tokens for s in self.samples)
        p90 = ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))] if ttfts else float("nan")
        return {
            "workload": self.workload,
            "routing": self.routing,
            "requests": len(self.samples),
            "errors": self.errors,
            "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1) if ttfts else None,
            "ttft_p90_ms": round(p90 * 1000, 1),
            "cached_share": round(cached / prompt, 3) if prompt else 0.0,
            "requests_per_s": round(len(self.samples) / self.seconds, 3),
            "affinity_hits": self.hits,
            "affinity_misses": self.misses,
        }


@contextmanager
def gateway(routing: str, engines: list[str], log_path: Path) -> Iterator[tuple[str, str]]:
    port, admin = free_port(), free_port()
    config = Path(tempfile.mkdtemp(prefix="llmgw-affinity-")) / "control.toml"
    lines = [
        f'listen = "127.0.0.1:{port}"',
        f'admin_listen = "127.0.0.1:{admin}"',
        'log_level = "warning"',
        f'data_dir = "{config.parent}"',
        "[router]",
        f'routing = "{routing}"',
    ]
    for number, url in enumerate(engines):
        lines += [
            "[[endpoints]]",
            f'id = "r{number + 1}"',
            f'url = "{url}"',
            f'models = ["{MODEL}"]',
            f"slots = {SLOTS}",
            f"engine_slots = {SLOTS}",
        ]
    config.write_text("\n".join(lines) + "\n")
    command = [str(ROOT / ".venv" / "bin" / "llmgw-control"), "run", "--config", str(config)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not become ready; see {log_path}")
            time.sleep(0.05)
        yield url, admin_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def affinity_counts(admin_url: str) -> tuple[float, float]:
    with urllib.request.urlopen(f"{admin_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    counts = {"hit": 0.0, "miss": 0.0}
    for line in text.splitlines():
        if line.startswith("llmgw_affinity_requests_total{"):
            for outcome in counts:
                if f'outcome="{outcome}"' in line:
                    counts[outcome] += float(line.rsplit(" ", 1)[1])
    return counts["hit"], counts["miss"]


async def stream_chat(
    client: httpx2.AsyncClient, messages: list[dict[str, str]], max_tokens: int, turn: int = 0
) -> tuple[str, Sample]:
    """One streamed turn: the answer and its sample (TTFT to the first content delta)."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft: float | None = None
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
        replica = response.headers.get("x-llmgw-replica", "")
        queued_ms = float(response.headers.get("x-llmgw-queued-ms", "0") or 0)
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    if ttft is None:
                        ttft = time.perf_counter() - started
                    pieces.append(text)
            if event.get("usage"):
                usage = event["usage"]
            if isinstance(event.get("timings"), dict):
                timings = event["timings"]
    details = usage.get("prompt_tokens_details") or {}
    prompt_ms = timings.get("prompt_ms")
    sample = Sample(
        ttft if ttft is not None else time.perf_counter() - started,
        int(usage.get("prompt_tokens", 0)),
        int(details.get("cached_tokens", 0)),
        turn=turn,
        replica=replica,
        queued_ms=queued_ms,
        prompt_ms=float(prompt_ms) if isinstance(prompt_ms, (int, float)) else None,
    )
    return "".join(pieces), sample


async def multi_turn(
    url: str, conversations: int, turns: int, concurrency: int, max_tokens: int, think: float, seed: int
) -> tuple[list[Sample], int]:
    samples: list[Sample] = []
    errors = 0
    send, receive = trio.open_memory_channel[int](conversations)
    for number in range(conversations):
        send.send_nowait(number)
    send.close()

    async def worker(client: httpx2.AsyncClient) -> None:
        nonlocal errors
        async for number in receive:
            topic = TOPICS[number % len(TOPICS)]
            messages = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"Customer {number}: I have a question about {topic}."},
            ]
            rng = random.Random(f"{seed}/{number}")
            for turn in range(turns):
                if turn and think > 0:
                    # The person reads the answer and types the next question; meanwhile other
                    # conversations' turns reach the replicas (see the module docstring).
                    await trio.sleep(rng.uniform(0.5, 1.5) * think)
                try:
                    answer, sample = await stream_chat(client, messages, max_tokens, turn + 1)
                except (httpx2.HTTPError, RuntimeError, ValueError):
                    errors += 1
                    break
                sample.conversation = number
                samples.append(sample)
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]},
                ]

    async with httpx2.AsyncClient(base_url=url, timeout=300) as client, trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker, client)
    return samples, errors


async def unique(url: str, requests: int, concurrency: int, max_tokens: int, seed: int) -> tuple[list[Sample], int]:
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(120)) for _ in range(requests)]
    samples: list[Sample] = []
    errors = 0
    send, receive = trio.open_memory_channel[str](requests)
    for prompt in prompts:
        send.send_nowait(prompt)
    send.close()

    async def worker(client: httpx2.AsyncClient) -> None:
        nonlocal errors
        async for prompt in receive:
            messages = [{"role": "system", "content": prompt}, {"role": "user", "content": "Summarize that."}]
            try:
                _, sample = await stream_chat(client, messages, max_tokens)
            except (httpx2.HTTPError, RuntimeError, ValueError):
                errors += 1
                continue
            samples.append(sample)

    async with httpx2.AsyncClient(base_url=url, timeout=300) as client, trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker, client)
    return samples, errors


def run_phase(workload: str, routing: str, args: argparse.Namespace, log_path: Path, seed: int) -> Phase:
    binary, model = build_engine.server_binary(), smollm2.ensure_model()
    with ExitStack() as stack:
        engines = [
            stack.enter_context(llama_server_process(binary, model, alias=MODEL, extra_args=ENGINE_ARGS))
            for _ in range(args.replicas)
        ]
        url, admin_url = stack.enter_context(gateway(routing, [e.url for e in engines], log_path))
        started = time.perf_counter()
        if workload == "multi-turn":
            samples, errors = trio.run(
                multi_turn, url, args.conversations, args.turns, args.concurrency, args.max_tokens, args.think, seed
            )
        else:
            samples, errors = trio.run(unique, url, args.unique, args.concurrency, args.max_tokens, seed)
        seconds = time.perf_counter() - started
        hits, misses = affinity_counts(admin_url)
    return Phase(workload, routing, samples, seconds, errors, hits, misses)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run: 8 conversations, 16 unique prompts")
    parser.add_argument("--rounds", type=int, default=None, help="pairs of (least-loaded, prefix) per workload")
    parser.add_argument("--conversations", type=int, default=None)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--unique", type=int, default=None, help="requests in the unique-prompt workload")
    parser.add_argument("--concurrency", type=int, default=4, help="conversations (or unique prompts) at a time")
    parser.add_argument(
        "--think", type=float, default=1.0, help="mean seconds a person takes between an answer and their next turn"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--replicas", type=int, default=2, choices=(2, 3), help="llama-server replicas")
    parser.add_argument("--json", type=Path, default=None, help="write every phase's summary here")
    parser.add_argument("--samples", type=Path, default=None, help="write every request's sample here (JSON lines)")
    args = parser.parse_args()
    args.rounds = args.rounds or 1
    args.conversations = args.conversations or (8 if args.quick else 24)
    args.unique = args.unique or (16 if args.quick else 48)
    log_path = Path(tempfile.mkdtemp(prefix="llmgw-affinity-")) / "gateway.log"
    phases: list[Phase] = []
    for workload in ("multi-turn", "unique"):
        for round_number in range(args.rounds):
            # Alternating which goes first, so a drift in the machine's load favours neither.
            order = ("least-loaded", "prefix") if round_number % 2 == 0 else ("prefix", "least-loaded")
            for routing in order:
                phase = run_phase(workload, routing, args, log_path, seed=round_number)
                print(json.dumps(phase.summary()), flush=True)
                phases.append(phase)
                if args.samples is not None:
                    with args.samples.open("a") as out:
                        for sample in phase.samples:
                            out.write(
                                json.dumps(
                                    {
                                        "workload": workload,
                                        "routing": routing,
                                        "round": round_number,
                                        **attrs.asdict(sample),
                                    }
                                )
                                + "\n"
                            )
    print()
    print(
        f"{'workload':<11} {'routing':<13} {'reqs':>5} {'err':>4} {'TTFT p50':>9} {'TTFT p90':>9} "
        f"{'cached':>7} {'req/s':>7} {'hit/miss':>9}"
    )
    for workload in ("multi-turn", "unique"):
        for routing in ("least-loaded", "prefix"):
            mine = [p for p in phases if p.workload == workload and p.routing == routing]
            merged = Phase(
                workload,
                routing,
                [s for p in mine for s in p.samples],
                sum(p.seconds for p in mine),
                sum(p.errors for p in mine),
                sum(p.hits for p in mine),
                sum(p.misses for p in mine),
            )
            row = merged.summary()
            print(
                f"{workload:<11} {routing:<13} {row['requests']:>5} {row['errors']:>4} "
                f"{row['ttft_p50_ms']:>7} ms {row['ttft_p90_ms']:>6} ms {row['cached_share']:>7.1%} "
                f"{row['requests_per_s']:>7.2f} {int(row['affinity_hits']):>4}/{int(row['affinity_misses'])}"
            )
    if args.json is not None:
        args.json.write_text(json.dumps([p.summary() for p in phases], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
