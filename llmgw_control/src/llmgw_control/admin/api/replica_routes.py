"""The replicas' routes: ``/replicas`` and one replica's engine output (``replica_logs.py``)."""

from __future__ import annotations

from ..standby_refusal import standby_leader
from ..standby_views import read_leader_fleet, standby_replica_views
from .context import ApiContext
from .core import Api, Call
from .replica_logs import register_replica_logs
from .schemas import ReplicaList, ReplicaView


def add_replica_routes(api: Api, ctx: ApiContext) -> None:
    @api.route("GET", "/replicas", summary="Every replica the reconciler manages", tag="replicas", response=ReplicaList)
    async def list_replicas(call: Call) -> ReplicaList:
        if ctx.fleet is None:
            return ReplicaList([])
        f = ctx.fleet
        standby, leader = standby_leader(f)
        if standby:
            fleet_of_leader = await read_leader_fleet(ctx.the_tenancy().store, f)
            return ReplicaList(standby_replica_views(f, fleet_of_leader), "standby", leader)
        out = []
        for r in sorted(f.reconciler.records.values(), key=lambda r: (r.profile_key, r.replica_id)):
            published = f.reconciler.replicas.get(r.replica_id)
            hung = published is not None and published.progress.hung_since is not None
            # Withdrawn by the gateway's hang watch (gateway/hang_watch.py) while its node still
            # reports it ready: not routable, and the detail says why.
            detail = "hung: its engine stopped answering; withdrawn until its /health answers" if hung else r.detail
            out.append(
                ReplicaView(
                    r.replica_id,
                    r.profile_key,
                    r.node_id,
                    r.port,
                    r.status,
                    detail,
                    r.draining,
                    published is not None and not hung,
                    published.in_flight if published else 0,
                    list(r.last_lines),
                    published.slots if published else 0,
                )
            )
        return ReplicaList(out)

    register_replica_logs(api, ctx.the_fleet)
