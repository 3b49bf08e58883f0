"""Pulls: downloading a model into control's files directory, then drafting its catalog entry.

A pull is asked for by the admin API (``POST /api/v1/models/pulls``): a Hub repository, revision
and file, or an allowed https URL with its sha256. It waits for one of ``max_concurrent_pulls``
slots, checks free space, downloads into ``models/<file>.partial`` (resuming after a dropped
connection, a bounded number of times), checks the sha256 (the Hub's LFS digest, or the one
given), and moves the file to ``models/<file>``, where the file server serves it to nodes like
any other. Then it reads the GGUF header and writes a **draft** model: context length from the
header, the memory estimate placement would use, weights pointing at control's file server.
The draft is not in the catalog: the operator changes it if they want and publishes it
(``POST .../publish``), which adds it as an API model. States:

``queued -> downloading -> verifying -> ready`` (a draft waits) ``-> published``; or ``failed``
(with the reason) or ``cancelled``; ``interrupted`` when control stopped mid-download (asking
for the same pull again continues from the ``.partial`` file). ``PULL_LIFECYCLE`` is the table;
every change goes through its ``move``.

Every pull's task runs in the manager's nursery (``run``), each in a cancel scope of its own so
``DELETE`` can stop one. Progress is in memory; the store holds each pull's document on every
change of state, so a restart keeps the drafts.
"""

from __future__ import annotations

import re
import secrets
import shutil
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

import attrs
import cattrs
import trio

from llmgw_shared.logs import get_logger
from llmgw_shared.threads import DISK, FILES
from llmgw_shared.transitions import Lifecycle

from ..api_errors import AdminApiError, bad_request, conflict, not_found
from ..catalog import ModelConfig, ProfileConfig, WeightsConfig
from ..catalog.gguf import NotGguf, Truncated, estimate_ram, read_metadata
from ..catalog.models import SHA256
from ..catalog.profile_key import NAME
from ..catalog.service import ModelService, check_model
from ..documents import CONVERTER
from ..store import Store, StoreError
from .download import DownloadFailed, DownloadProgress, Interrupted, download
from .hub import Hub
from .names import gguf_path, repo_id, revision
from .net_guard import NetGuard, UrlRefused

log = get_logger(__name__)

# Retries of one pull after a dropped connection, each continuing where the last stopped.
MAX_ATTEMPTS = 5
# Space left free in the files directory beyond the pull itself (logs, other writers).
FREE_MARGIN = 256 * 1024 * 1024
# The GGUF header's share of a file, read for the draft (as catalog/claims.py reads it).
HEADER_BYTES = 16 * 1024 * 1024
# A draft's context: the model's own, capped so the first replica's KV cache stays modest;
# the operator raises it before publishing if they want the whole window.
DRAFT_CONTEXT_CAP = 8192
# Pulls remembered at most (finished ones beyond this are forgotten, oldest first).
MAX_PULLS = 200


class PullState(StrEnum):
    QUEUED = "queued"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    READY = "ready"
    PUBLISHED = "published"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


# Cancelling forgets a pull in any state (its document is deleted): the one end.
_CUT_SHORT = {PullState.FAILED, PullState.CANCELLED, PullState.INTERRUPTED}
PULL_LIFECYCLE = Lifecycle(
    "pull",
    PullState,
    start={PullState.QUEUED},
    transitions={
        # INTERRUPTED: control stopped before the pull ended (found so when the stored pulls are read).
        PullState.QUEUED: {PullState.DOWNLOADING, PullState.CANCELLED, PullState.INTERRUPTED},
        PullState.DOWNLOADING: {PullState.VERIFYING, *_CUT_SHORT},
        # FAILED from VERIFYING: a digest that does not match, or a file that is no GGUF model.
        PullState.VERIFYING: {PullState.READY, *_CUT_SHORT},
        PullState.READY: {PullState.PUBLISHED, PullState.CANCELLED},
        PullState.PUBLISHED: {PullState.CANCELLED},
        PullState.FAILED: {PullState.CANCELLED},
        PullState.INTERRUPTED: {PullState.CANCELLED},
        PullState.CANCELLED: set(),
    },
)
# No task works on these: they are kept (and stored) as they are, and forgotten oldest first.
FINISHED = frozenset(
    {PullState.READY, PullState.PUBLISHED, PullState.FAILED, PullState.CANCELLED, PullState.INTERRUPTED}
)
# A pull of the same file in one of these states is refused: one download per file at a time.
IN_PROGRESS = frozenset(PullState) - FINISHED


@attrs.define
class Pull:
    id: str
    repo: str
    revision: str
    file: str
    url: str
    name: str
    sha256: str
    size: int
    model: str
    # Stored as its string; a document read back names one of PullState's values or is refused.
    state: PullState = attrs.field(default=PullState.QUEUED, converter=PullState)
    error: str = ""
    created_at: float = 0.0
    draft: ModelConfig | None = None
    estimate_ram_mib: int = 0
    estimate_how: str = ""
    # In memory only:
    progress: DownloadProgress = attrs.field(factory=DownloadProgress, metadata={"memory": True})
    scope: trio.CancelScope | None = attrs.field(default=None, metadata={"memory": True})

    def document(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in attrs.fields(Pull) if not f.metadata.get("memory")}
        doc["draft"] = CONVERTER.unstructure(self.draft) if self.draft else None
        return doc

    def eta(self) -> float | None:
        rate = self.progress.rate()
        total = self.size or self.progress.total
        if self.state != PullState.DOWNLOADING or rate <= 0 or not total:
            return None
        return max(0.0, (total - self.progress.done) / rate)


def pull_from_document(doc: dict[str, Any]) -> Pull:
    draft = doc.get("draft")
    fields = {f.name for f in attrs.fields(Pull) if not f.metadata.get("memory")}
    values = {k: v for k, v in doc.items() if k in fields and k != "draft"}
    pull = Pull(**values)
    pull.draft = CONVERTER.structure(draft, ModelConfig) if draft else None
    return pull


# A pull in one of these has its file in models/ (a cancel leaves it there).
_DRAFTED = frozenset({PullState.READY, PullState.PUBLISHED})
_SAFE_FILE = re.compile(r"[^A-Za-z0-9._\-]")


def model_name_for(file: str) -> str:
    """A catalog name from a file name: ``Llama-3.2-1B-Q4_K_M.gguf`` -> ``llama-3.2-1b-q4_k_m``."""
    stem = file.rsplit("/", 1)[-1][:-5].lower()
    name = _SAFE_FILE.sub("-", stem).strip("-._")[:96] or "model"
    return name if NAME.fullmatch(name) else "model"


class Pulls:
    def __init__(
        self,
        hub: Hub,
        guard: NetGuard,
        models_dir: Path,
        public_url: str,
        store: Store,
        models: ModelService | None,
        max_concurrent: int,
    ) -> None:
        self.hub = hub
        self.guard = guard
        self.models_dir = models_dir
        self.public_url = public_url.rstrip("/")
        self.store = store
        self.models = models
        self.pulls: dict[str, Pull] = {}
        self._slots = trio.Semaphore(max_concurrent)
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ the task

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own every pull's task until cancelled; stored pulls cut short by a stop become ``interrupted``."""
        try:
            for doc in await self.store.list_pulls():
                try:
                    pull = pull_from_document(doc)
                except (TypeError, ValueError, KeyError, cattrs.BaseValidationError):
                    log.warning("a stored pull could not be read; it is ignored")
                    continue
                if pull.state not in FINISHED:
                    pull.state = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.INTERRUPTED)
                    pull.error = "control stopped during the pull; ask again to continue"
                self.pulls[pull.id] = pull
        except StoreError as exc:
            log.warning("the stored pulls could not be read (%s): starting with none", exc)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # ------------------------------------------------------------------ API operations

    async def start(self, body: dict[str, Any]) -> Pull:
        """A new pull from the API body (validated here: the one edge for pull requests)."""
        if self._nursery is None:
            raise AdminApiError(503, "not_ready", "the model mirror is starting")
        unknown = set(body) - {"repo", "revision", "file", "url", "sha256", "size", "model"}
        if unknown:
            raise bad_request(sorted(unknown)[0], "unknown field")
        model = body.get("model")
        if body.get("url"):
            if body.get("repo"):
                raise bad_request("url", "give a Hub repo and file, or a url, not both")
            url = body["url"]
            if not isinstance(url, str):
                raise bad_request("url", "must be a string")
            sha = body.get("sha256")
            if not isinstance(sha, str) or not SHA256.fullmatch(sha):
                raise bad_request("sha256", "a URL pull needs the file's sha256 (64 lowercase hex digits)")
            size = body.get("size", 0)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise bad_request("size", "must be the file size in bytes (or 0: the server's)")
            file = gguf_path(url.split("?", 1)[0].rsplit("/", 1)[-1], "url")
            try:
                await self.guard.check(url)
            except UrlRefused as exc:
                raise bad_request("url", str(exc), code="url_refused") from None
            repo, rev = "", ""
        else:
            repo = repo_id(body.get("repo"))
            rev = revision(body.get("revision", "main"))
            file = gguf_path(body.get("file"))
            listed = {f.path: f for f in await self.hub.gguf_files(repo, rev)}
            found = listed.get(file)
            if found is None:
                raise not_found("file", f"{repo}/{file}", field="file")
            sha, size, url = found.sha256, found.size, self.hub.resolve_url(repo, rev, file)
        name = file.rsplit("/", 1)[-1]
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._\-]{0,199}", name):
            raise bad_request("file", "the file name must be letters, digits, '.', '_' and '-' to be served")
        model_name = model or model_name_for(name)
        if not isinstance(model_name, str) or not NAME.fullmatch(model_name):
            raise bad_request("model", "a model name uses letters, digits, '.', '_' and '-' (no ':'), at most 96")
        for other in self.pulls.values():
            if other.name == name and other.state in IN_PROGRESS:
                raise conflict(f"{name} is being pulled already (pull {other.id})", field="file")
        done = self.models_dir / name
        if done.exists() and not self._same_pull_again(name, sha):
            raise conflict(f"models/{name} exists already (with other contents)", field="file")
        pull = Pull(secrets.token_hex(8), repo, rev, file, url, name, sha, size, model_name, created_at=time.time())
        self.pulls[pull.id] = pull
        self._forget_old()
        await self._save(pull)
        self._nursery.start_soon(self._pull, pull)
        return pull

    def _same_pull_again(self, name: str, sha: str) -> bool:
        return any(p.name == name and p.sha256 == sha and p.state in _DRAFTED for p in self.pulls.values())

    def get(self, pull_id: str) -> Pull:
        pull = self.pulls.get(pull_id)
        if pull is None:
            raise not_found("pull", pull_id)
        return pull

    async def cancel(self, pull_id: str) -> None:
        """Stop a pull in progress and forget it (its ``.partial`` file is removed)."""
        pull = self.get(pull_id)
        if pull.scope is not None:
            pull.scope.cancel()
        was = pull.state
        pull.state = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.CANCELLED)
        self.pulls.pop(pull_id, None)
        partial = self.models_dir / f"{pull.name}.partial"
        if was not in _DRAFTED:
            await DISK.run(lambda: partial.unlink(missing_ok=True))
        try:
            await self.store.delete_pull(pull_id)
        except StoreError as exc:
            log.info("pull %s was not in the store (%s)", pull_id, exc)

    async def update_draft(self, pull_id: str, draft: ModelConfig) -> Pull:
        pull = self.get(pull_id)
        if pull.state != PullState.READY or pull.draft is None:
            raise conflict(f"pull {pull_id} has no draft to change (state {pull.state})")
        if {p.weights for p in draft.profiles} != {p.weights for p in pull.draft.profiles}:
            raise bad_request("profiles", "a draft's weights are the pulled file: change anything else")
        if self.models is not None:
            check_model(draft, self.models.catalog)
        pull.draft = draft
        pull.model = draft.name
        await self._save(pull)
        return pull

    async def publish(self, pull_id: str) -> ModelConfig:
        pull = self.get(pull_id)
        if self.models is None:
            raise conflict("this control daemon runs without a fleet (agents.listen is not set)", code="no_fleet")
        if pull.state != PullState.READY or pull.draft is None:
            raise conflict(f"pull {pull_id} is {pull.state}: only a ready pull's draft is published")
        model = await self.models.add(pull.draft)
        pull.state = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.PUBLISHED)
        await self._save(pull)
        return model

    # ------------------------------------------------------------------ the work

    async def _save(self, pull: Pull) -> None:
        try:
            await self.store.put_pull(pull.id, pull.document())
        except StoreError as exc:
            log.warning("pull %s: its state could not be stored (%s)", pull.id, exc)

    def _forget_old(self) -> None:
        finished = [p for p in self.pulls.values() if p.state in FINISHED]
        for pull in sorted(finished, key=lambda p: p.created_at)[: max(0, len(self.pulls) - MAX_PULLS)]:
            self.pulls.pop(pull.id, None)

    async def _pull(self, pull: Pull) -> None:
        with trio.CancelScope() as scope:
            pull.scope = scope
            try:
                async with self._slots:
                    await self._download(pull)
                    await self._draft(pull)
            except (DownloadFailed, OSError) as exc:
                self._fail(pull, str(exc)[:500])
                log.warning("pull %s (%s) failed: %s", pull.id, pull.name, pull.error)
            except Exception as exc:  # a daemon must not stop for one pull; the reason is kept
                self._fail(pull, f"{type(exc).__name__}: {exc}"[:500])
                log.exception("pull %s failed unexpectedly", pull.id)
            finally:
                pull.scope = None
        if scope.cancelled_caught:
            return  # cancelled: forgotten by cancel()
        await self._save(pull)

    @staticmethod
    def _fail(pull: Pull, error: str) -> None:
        if pull.state == PullState.CANCELLED:
            return  # cancel() came first and has forgotten it: nothing to record
        pull.state, pull.error = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.FAILED), error

    def _check_space(self, needed: int) -> None:
        self.models_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.models_dir).free
        if needed + FREE_MARGIN > free:
            raise DownloadFailed(
                f"not enough space in the files directory: the pull needs {needed} bytes "
                f"(+{FREE_MARGIN // 2**20} MiB margin), {free} are free"
            )

    async def _download(self, pull: Pull) -> None:
        pull.state = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.DOWNLOADING)
        await self._save(pull)
        partial = self.models_dir / f"{pull.name}.partial"
        have = await DISK.run(lambda: partial.stat().st_size if partial.exists() else 0, abandon=True)
        if pull.size:
            await DISK.run(self._check_space, max(0, pull.size - have))
        token = self.hub.config.token() if pull.repo else None
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                digest = await download(
                    self.guard,
                    pull.url,
                    partial,
                    size=pull.size or None,
                    token=token,
                    progress=pull.progress,
                    on_total=self._space_for(pull),
                )
                break
            except Interrupted as exc:
                if attempt == MAX_ATTEMPTS:
                    raise DownloadFailed(f"gave up after {attempt} attempts: {exc}") from None
                log.info("pull %s: %s; continuing (attempt %d)", pull.id, exc, attempt + 1)
                await trio.sleep(min(2.0**attempt / 4, 10.0))
        pull.size = pull.progress.total or pull.size
        pull.state = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.VERIFYING)
        if digest != pull.sha256:
            await DISK.run(lambda: partial.unlink(missing_ok=True))
            raise DownloadFailed(f"sha256 mismatch: expected {pull.sha256}, the file has {digest} (removed)")
        await DISK.run(partial.replace, self.models_dir / pull.name)

    def _space_for(self, pull: Pull) -> Any:
        def check(remaining: int) -> None:
            if not pull.size:  # the size came from the server: check the space now, before any byte
                self._check_space(remaining)

        return check

    async def _draft(self, pull: Pull) -> None:
        path = self.models_dir / pull.name

        def header() -> bytes:
            with open(path, "rb") as handle:
                return handle.read(HEADER_BYTES)

        metadata: dict[str, Any] | None = None
        try:
            metadata = read_metadata(await FILES.run(header, abandon=True))
        except (NotGguf, Truncated) as exc:
            raise DownloadFailed(f"the file is not a readable GGUF model: {exc}") from None
        arch = metadata.get("general.architecture")
        trained = metadata.get(f"{arch}.context_length")
        context = min(int(trained), DRAFT_CONTEXT_CAP) if isinstance(trained, int) and trained >= 64 else 4096
        profile = ProfileConfig(
            name="default",
            weights=WeightsConfig(
                url=f"{self.public_url}/files/models/{pull.name}", sha256=pull.sha256, size=pull.size
            ),
            context=context,
            parallel=1,
        )
        estimate = estimate_ram(metadata, weights_bytes=pull.size, context=context * profile.parallel)
        pull.draft = ModelConfig(name=pull.model, profiles=[profile])
        pull.estimate_ram_mib, pull.estimate_how = estimate.ram_mib, estimate.how
        pull.state = PULL_LIFECYCLE.move(pull.id, pull.state, PullState.READY)
        log.info("pull %s: %s is ready as a draft model %s (%s)", pull.id, pull.name, pull.model, estimate.how)
