"""The node reports its weights cache (what control's weights GC decides on): in hello, after use, after removal."""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs
from node.helpers import next_replica_state, replica_spec
from node.release_server import FileServer

from llmgw_dev.engine_proc import free_port
from llmgw_node.config import ConfiguredEngine, NodeConfig
from llmgw_node.service import NodeService, open_node_service
from llmgw_node.supervisor import Timing
from llmgw_shared.wire import RemoveWeights, StartReplica, StopReplica, WeightsHeld, WeightsSpec
from support.waiting import wait_until


async def _held_until(svc: NodeService, pred: object) -> list[WeightsHeld]:
    await wait_until(lambda: pred(svc.weights_held), timeout=10)  # type: ignore[operator]
    return svc.weights_held


async def test_the_cache_is_reported_with_its_use_and_goes_when_removed(
    tmp_path: Path, node_config: NodeConfig, files: FileServer, fast_timing: Timing
) -> None:
    script = tmp_path / "fake-llama-server"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "--version" ]; then echo \'version: 1 (build 1, commit x)\' >&2; '
        "exit 0; fi\nexec sleep 30\n"
    )
    script.chmod(0o755)
    config = attrs.evolve(node_config, engines=[ConfiguredEngine(name="llama.cpp", path=str(script), version="b11312")])
    data = b"model weights" * 1000
    sha = hashlib.sha256(data).hexdigest()
    weights = WeightsSpec(files.add_file("m.gguf", data), sha, len(data))
    async with open_node_service(config, timing=fast_timing) as svc:
        assert svc.hello().weights == []
        spec = replica_spec("w1", weights, free_port(), args=[])
        assert (await svc.handle(StartReplica(id="1", fencing_token=1, replica=spec))).ok
        await next_replica_state(svc, "w1", lambda s: s.status == "starting")
        (held,) = await _held_until(svc, lambda h: len(h) == 1 and h[0].in_use)
        assert held.sha256 == sha and held.size == len(data) and held.last_used > 0
        assert svc.hello().weights == [held]
        # In use: a removal keeps it (the node's own rule, whatever control asks).
        ack = await svc.handle(RemoveWeights(id="2", fencing_token=1, sha256=[sha]))
        assert not ack.ok and "kept 1 file(s)" in ack.error
        assert (await svc.handle(StopReplica(id="3", fencing_token=1, replica_id="w1", grace_s=0.5))).ok
        await next_replica_state(svc, "w1", lambda s: s.status == "stopped")
        (after,) = await _held_until(svc, lambda h: len(h) == 1 and not h[0].in_use)
        assert after.last_used >= held.last_used  # the end of its use is its last use
        assert (await svc.handle(RemoveWeights(id="4", fencing_token=1, sha256=[sha]))).ok
        assert await _held_until(svc, lambda h: h == []) == []


async def test_a_hold_given_back_without_a_replica_report_is_listed_at_once(
    node_config: NodeConfig, fast_timing: Timing
) -> None:
    # The order CI once hit: the listing ran on a replica's last report, and the hold on the file was given back
    # only after it. Nothing but the giving back is left to wake the listing, which must not wait for
    # the minute's re-listing (FACTS_INTERVAL) to stop saying "in use".
    async with open_node_service(node_config, timing=fast_timing) as svc:
        sha = hashlib.sha256(b"weights").hexdigest()
        (svc.weights.root / sha).parent.mkdir(parents=True, exist_ok=True)
        (svc.weights.root / sha).write_bytes(b"weights")
        svc.weights.acquire(sha, "s1")
        await _held_until(svc, lambda h: len(h) == 1 and h[0].in_use)
        svc.weights.give_back(sha, "s1")
        await _held_until(svc, lambda h: len(h) == 1 and not h[0].in_use)
