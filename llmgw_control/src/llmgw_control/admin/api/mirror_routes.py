"""The model mirror's routes: ``/hub/search``, ``/hub/files`` and ``/models/pulls``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...api_errors import AdminApiError, bad_request, conflict
from ...catalog import Claim, ModelConfig
from ...catalog.gguf import estimate_ram
from ...mirror.names import repo_id, revision, search_text
from ...mirror.pulls import Pull, Pulls
from ...mirror.service import Mirror
from .core import Api, Call, Param
from .mirror_schemas import (
    HubFilesAnswer,
    HubFileView,
    HubRepoView,
    HubSearchAnswer,
    PullAnswer,
    PullList,
    PullRequest,
    PullView,
)
from .schemas import ModelDefinition

if TYPE_CHECKING:
    from ...fleet.fleet import Fleet

# The context a file's fit is judged with before its header is read: the catalog's default.
FIT_CONTEXT = 4096


def pull_view(pull: Pull) -> PullView:
    return PullView(
        pull.id,
        pull.state,
        pull.repo,
        pull.revision,
        pull.file,
        pull.url.split("?", 1)[0],
        pull.name,
        pull.sha256,
        pull.size or pull.progress.total,
        pull.progress.done,
        round(pull.progress.rate(), 1),
        pull.eta(),
        pull.error,
        pull.draft,
        pull.estimate_ram_mib,
        pull.estimate_how,
    )


def add_mirror_routes(api: Api, mirror: Mirror | None, fleet: Fleet | None) -> None:
    def the_mirror() -> Mirror:
        if mirror is None:
            raise AdminApiError(503, "not_ready", "the model mirror is not running on this daemon")
        return mirror

    def pulls() -> Pulls:
        found = the_mirror().pulls
        if found is None:
            raise conflict("pulls need a files directory to pull into: set agents.files_dir", code="no_files_dir")
        return found

    def fit(size: int) -> tuple[int, bool | None, str]:
        estimate = estimate_ram(None, weights_bytes=size, context=FIT_CONTEXT)
        if fleet is None:
            return estimate.ram_mib, None, "no fleet on this daemon"
        engine = next((e for e in fleet.catalog.engines if e.name == "llama.cpp"), fleet.catalog.engines[0])
        reason = fleet.reconciler.would_fit(Claim(estimate.ram_mib), (engine.name, engine.version))
        return estimate.ram_mib, not reason, reason

    _add_hub_routes(api, the_mirror, fit)
    _add_pull_routes(api, pulls)


def _add_hub_routes(
    api: Api, the_mirror: Callable[[], Mirror], fit: Callable[[int], tuple[int, bool | None, str]]
) -> None:
    """Search the Hub and list a repository's files, each with its fit on this fleet."""

    @api.route(
        "GET",
        "/hub/search",
        summary="Search the Hub for GGUF repositories, most downloaded first",
        tag="mirror",
        response=HubSearchAnswer,
        errors=(502, 503, 504),
        query=(
            Param("q", doc="Search text (at most 200 characters)"),
            Param("limit", doc="At most this many (1..hub.search_limit)"),
        ),
    )
    async def hub_search(call: Call) -> HubSearchAnswer:
        text = search_text(call.query.get("q", ""))
        limit_text = call.query.get("limit") or "0"
        if not limit_text.isdigit() or len(limit_text) > 4:
            raise bad_request("limit", "must be a whole number")
        hub = the_mirror().hub
        repos = await hub.search(text, int(limit_text) or None)
        return HubSearchAnswer(hub.endpoint, [HubRepoView(r.id, r.downloads, r.likes, r.updated) for r in repos])

    @api.route(
        "GET",
        "/hub/files",
        summary="A Hub repository's GGUF files: size, quantisation, fit on the fleet",
        tag="mirror",
        response=HubFilesAnswer,
        errors=(404, 502, 503, 504),
        query=(Param("repo", doc="owner/name"), Param("revision", doc="Branch, tag or commit (main)")),
    )
    async def hub_files(call: Call) -> HubFilesAnswer:
        repo = repo_id(call.query.get("repo"))
        rev = revision(call.query.get("revision") or "main")
        files = await the_mirror().hub.gguf_files(repo, rev)
        views = []
        for f in files:
            ram, fits, detail = fit(f.size)
            views.append(HubFileView(f.path, f.size, f.sha256, f.quantisation, f.split, ram, fits, detail))
        return HubFilesAnswer(repo, rev, views)


def _add_pull_routes(api: Api, pulls: Callable[[], Pulls]) -> None:
    """Pull a file into the files directory, follow it, edit its draft, publish it."""

    @api.route(
        "POST",
        "/models/pulls",
        summary="Pull a model file into control's files directory (a draft model when done)",
        tag="mirror",
        body=PullRequest,
        response=PullAnswer,
        status=202,
        errors=(404, 409, 502, 503, 504),
    )
    async def start_pull(call: Call) -> PullAnswer:
        return PullAnswer(pull_view(await pulls().start(call.raw)))

    @api.route(
        "GET",
        "/models/pulls",
        summary="Every pull with its progress",
        tag="mirror",
        response=PullList,
        errors=(409, 503),
    )
    async def list_pulls(call: Call) -> PullList:
        return PullList([pull_view(p) for p in sorted(pulls().pulls.values(), key=lambda p: p.created_at)])

    @api.route(
        "GET",
        "/models/pulls/{pull_id}",
        summary="One pull: state, bytes, rate, ETA, draft",
        tag="mirror",
        response=PullAnswer,
        errors=(404, 409, 503),
    )
    async def get_pull(call: Call) -> PullAnswer:
        return PullAnswer(pull_view(pulls().get(call.path["pull_id"])))

    @api.route(
        "DELETE",
        "/models/pulls/{pull_id}",
        summary="Cancel a pull (or forget a finished one)",
        tag="mirror",
        status=204,
        errors=(404, 409, 503),
    )
    async def cancel_pull(call: Call) -> None:
        await pulls().cancel(call.path["pull_id"])

    @api.route(
        "PUT",
        "/models/pulls/{pull_id}/draft",
        summary="Change a ready pull's draft model before it is published (not its weights)",
        tag="mirror",
        body=ModelConfig,
        response=PullAnswer,
        errors=(404, 409, 503),
    )
    async def edit_draft(call: Call) -> PullAnswer:
        return PullAnswer(pull_view(await pulls().update_draft(call.path["pull_id"], call.body)))

    @api.route(
        "POST",
        "/models/pulls/{pull_id}/publish",
        summary="Add a ready pull's draft to the catalog",
        tag="mirror",
        response=ModelDefinition,
        status=201,
        errors=(404, 409, 503),
    )
    async def publish(call: Call) -> ModelDefinition:
        return ModelDefinition(await pulls().publish(call.path["pull_id"]), "api")
