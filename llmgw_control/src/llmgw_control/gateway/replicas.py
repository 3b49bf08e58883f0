"""The replicas the gateway may send requests to, with the counters the balancer reads.

Gateway-only mode fills the set once from the config (its static replicas); otherwise the
reconciler publishes a replica when it becomes ready and withdraws it before it stops, so the
gateway never sends a request to an engine that is going away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import attrs

from .engine_facts import EngineFacts
from .progress import Progress

# Slots of a static replica whose config does not say: llmgw knows nothing of that engine, so the
# bound should only stop a runaway, not queue requests the engine could serve. vLLM's default
# max_num_seqs is 256; for llama-server set it to its -np so the gateway queues (and orders by
# priority) what the engine would otherwise queue unseen.
DEFAULT_STATIC_REPLICA_SLOTS = 256


@attrs.define(eq=False)
class Replica:
    id: str
    url: str
    models: frozenset[str]
    weight: float = 1.0
    # The bearer token the engine requires; never the client's key, never logged.
    api_key: str = attrs.field(default="", repr=False)
    # The model name the engine expects in requests, when it differs from what clients ask for
    # (a client asks for "llama:gpu", vLLM serves "llama"); empty: send the request unchanged.
    served_name: str = ""
    # The LoRA adapters its engine holds, (model name, scale) in the engine's order, and how a
    # request selects one (gateway/adapters.py: "lora-field" or "model-name"; "": none).
    adapters: tuple[tuple[str, float], ...] = ()
    adapter_mode: str = ""
    # Requests it serves at once (llama-server's -np); more wait in the gateway's queue.
    slots: int = DEFAULT_STATIC_REPLICA_SLOTS
    # Slots taken, by the activator's slot guards only (gateway/activator.py).
    in_flight: int = 0
    # Avoided until then after a failure (trio clock); infinity while it is withdrawn as hung
    # (gateway/hang_watch.py), when it is not chosen even as a last resort.
    cooldown_until: float = 0.0
    # When the last request finished here; the idle unloader reads it.
    last_used: float = 0.0
    # Since when every slot has been busy (trio clock), None while one is free: the reconciler
    # counts a model whose replicas stay full as demand for another replica.
    full_since: float | None = None
    # llama-server's slots (its -np) when requests may name one (``id_slot``,
    # gateway/engine_slots.py); 0: the engine cannot be told, it chooses.
    engine_slots: int = 0
    # What its engine said it serves (gateway/capabilities.py), once asked; None: not yet.
    facts: EngineFacts | None = None
    # When its engine may be asked again after it did not answer (trio clock).
    probe_after: float = 0.0
    # The engine slots this gateway's requests hold now, claimed and given back per attempt.
    held_engine_slots: set[int] = attrs.field(factory=set)
    # Whose conversation each engine slot's KV cache holds (the affinity id that last used it),
    # least recently used first: gateway/engine_slots.py gives an id its own slot back, and a new
    # id the slot whose conversation has waited longest. One entry per engine slot, all unowned
    # at first, in number order.
    engine_slot_owners: dict[int, bytes | None] = attrs.field(init=False)
    # Its engine's last byte and the requests waiting on it, for the hang watch (gateway/hang_watch.py).
    progress: Progress = attrs.field(factory=Progress, init=False)

    @engine_slot_owners.default
    def _unowned_engine_slots(self) -> dict[int, bytes | None]:
        return dict.fromkeys(range(self.engine_slots))


# Told a profile key whose replicas have slots requests may take now (published, resized, back
# from hung): the activator hands them to its waiters.
SlotsOpened = Callable[[str], None]


class ReplicaSet:
    def __init__(self, replicas: Iterable[Replica] = ()) -> None:
        self._by_id: dict[str, Replica] = {}
        self._by_model: dict[str, list[Replica]] = {}
        # Added by each listener as it is built (the activator); never replaced.
        self._listeners: list[SlotsOpened] = []
        for replica in replicas:
            self.publish(replica)

    def listen(self, listener: SlotsOpened) -> None:
        """Tell ``listener`` of every model whose replicas opened slots from now on."""
        self._listeners.append(listener)

    def publish(self, replica: Replica) -> None:
        self.withdraw(replica.id)
        self._by_id[replica.id] = replica
        for model in replica.models:
            self._by_model.setdefault(model, []).append(replica)
        self.slots_opened(replica)

    def resize(self, replica_id: str, slots: int) -> None:
        """A published replica's bound on requests at once changed; its counters stay."""
        replica = self._by_id.get(replica_id)
        if replica is None or replica.slots == slots:
            return
        replica.slots = slots
        self.slots_opened(replica)

    def slots_opened(self, replica: Replica) -> None:
        """``replica`` may take requests it could not (it was published, resized or readmitted)."""
        for model in replica.models:
            for listener in self._listeners:
                listener(model)

    def withdraw(self, replica_id: str) -> Replica | None:
        replica = self._by_id.pop(replica_id, None)
        if replica is not None:
            for model in replica.models:
                remaining = [r for r in self._by_model.get(model, []) if r is not replica]
                if remaining:
                    self._by_model[model] = remaining
                else:
                    self._by_model.pop(model, None)
        return replica

    def get(self, replica_id: str) -> Replica | None:
        return self._by_id.get(replica_id)

    def for_model(self, model: str) -> list[Replica]:
        return self._by_model.get(model, [])

    def models(self) -> list[str]:
        return sorted(self._by_model)

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)
