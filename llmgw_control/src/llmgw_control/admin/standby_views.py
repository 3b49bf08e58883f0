"""The admin API's fleet on a standby: the leader's fleet as the store holds it, and the refusal
of fleet writes that only the leader can do.

A standby talks to no node and runs no reconciler, so its in-memory fleet is empty; answering
from it would be an empty list that lies. What the store holds of the leader's fleet is:

* the replica view (``store/ops_view.py``): the ready replicas the leader routes to;
* the node identities (``nodes``: onboarded nodes, their labels and cordon flag);
* the fleet holders (``fleet_holders``): the nodes that held replicas under the leader.

A replica's node is not in the view, but its id is: replica ids carry an HMAC of (profile key,
nonce, node id) under the cluster secret every daemon shares (``fleet/replica_ids.py``), so the
node is found by checking the known node ids against it; no guess, and nothing extra stored.

Fleet writes are refused on a standby: ``standby_refusal.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import attrs

from ..catalog import Resolved
from ..store import NodeIdentity, PublishedReplica, PublishedReplicas
from .api.schemas import (
    ClaimView,
    FactsView,
    ModelView,
    NodeView,
    ReplicaOfModel,
    ReplicaOnNode,
    ReplicaView,
)

if TYPE_CHECKING:
    from ..fleet.fleet import Fleet
    from ..store import Store

# What a replica in the leader's view is, in the words of the replica and node listings.
VIEW_STATE = "ready"
VIEW_DETAIL = "in the leader's replica view"


@attrs.frozen
class LeaderFleet:
    """What the store holds of the leader's fleet, read once per answer."""

    view: PublishedReplicas | None
    identities: dict[str, NodeIdentity]
    # Replica id -> the node it was minted for ("" when none of the known nodes matches).
    node_of: dict[str, str]
    # Every node the store knows of: identities, fleet holders, nodes of replicas.
    node_ids: list[str]

    @property
    def replicas(self) -> tuple[PublishedReplica, ...]:
        return self.view.replicas if self.view is not None else ()


async def read_leader_fleet(store: Store, fleet: Fleet) -> LeaderFleet:
    """The leader's fleet from the store; a store error propagates (the answer is a 503, not a
    list that says the fleet is empty)."""
    view = await store.replica_view()
    identities = {i.id: i for i in await store.list_nodes()}
    holders = await store.fleet_holders()
    known = set(identities) | (set(holders.nodes) if holders is not None else set())
    ids = fleet.reconciler.ids
    node_of: dict[str, str] = {}
    for replica in view.replicas if view is not None else ():
        node_of[replica.id] = next(
            (n for n in sorted(known) if ids.minted_for(replica.id, n, [replica.profile_key]) is not None), ""
        )
    all_nodes = known | {n for n in node_of.values() if n}
    return LeaderFleet(view, identities, node_of, sorted(all_nodes))


def port_of(url: str) -> int:
    try:
        return urlsplit(url).port or 0
    except ValueError:
        return 0


def _empty_facts() -> FactsView:
    return FactsView(os="", arch="", cpu="", cores=0, cpu_features=[], ram_total_mib=0, gpus=[], nvidia_driver=None)


def standby_node_view(leader: LeaderFleet, node_id: str) -> NodeView:
    """A node as the store knows it: ``registered`` (this daemon has no connection to it), its
    stored labels and cordon flag, and its replicas in the leader's view."""
    identity = leader.identities.get(node_id)
    replicas = [
        ReplicaOnNode(r.id, f"{VIEW_STATE} ({VIEW_DETAIL})", port_of(r.url))
        for r in leader.replicas
        if leader.node_of.get(r.id) == node_id
    ]
    return NodeView(
        id=node_id,
        state="registered",
        address="",
        cordoned=identity.cordoned if identity is not None else False,
        labels=dict(identity.labels) if identity is not None else {},
        facts=_empty_facts(),
        warnings=[],
        engines=[],
        shards=replicas,
    )


def standby_replica_views(fleet: Fleet, leader: LeaderFleet) -> list[ReplicaView]:
    """The leader's ready replicas; ``routable`` and ``in_flight`` are this daemon's (its gateway
    follows the view, and counts only its own requests)."""
    out = []
    for r in sorted(leader.replicas, key=lambda r: (r.profile_key, r.id)):
        here = fleet.reconciler.replicas.get(r.id)
        out.append(
            ReplicaView(
                r.id,
                r.profile_key,
                leader.node_of.get(r.id, ""),
                port_of(r.url),
                VIEW_STATE,
                VIEW_DETAIL,
                False,
                here is not None,
                here.in_flight if here else 0,
                [],
                r.slots,
            )
        )
    return out


def standby_model_view(fleet: Fleet, leader: LeaderFleet, resolved: Resolved) -> ModelView:
    profile_key = resolved.profile_key
    replicas = [r for r in leader.replicas if r.profile_key == profile_key]
    return ModelView(
        model=resolved.model.name,
        profile=resolved.profile.name,
        key=profile_key,
        source=fleet.catalog.source(resolved.model.name),
        replicas=[ReplicaOfModel(r.id, leader.node_of.get(r.id, ""), port_of(r.url), VIEW_STATE) for r in replicas],
        ready=len(replicas),
        waiting_requests=0,
        # A standby places nothing: why a profile has no replica is the leader's to say.
        status="ready" if replicas else "no ready replica in the leader's view",
        claim=ClaimView(0, 0),
    )
