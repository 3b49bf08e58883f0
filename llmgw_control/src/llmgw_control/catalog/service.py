"""Models added, changed and removed through the admin API: stored, then applied to the catalog.

The config file's models and the stored ones are merged at start. **The config file wins**: a
stored model whose name the config file also declares is not used (a warning says so at start),
and the API refuses to add, change or remove a config model (409), so each name has exactly one
place where it is edited. We chose this over refusing to start because the store is shared: one
daemon's config change must not stop every other daemon on the same database from starting.

A change reaches the catalog (which the gateway's ``FleetDirectory`` and the reconciler read) at
once on this daemon, and other daemons on the same store within one poll of the store's model
revision. A changed profile whose engine command line changed has its replicas drained, so the
reconciler starts them again from the new definition; removing a model drains its replicas.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import cattrs
import trio

from llmgw_shared.logs import get_logger

from ..api_errors import bad_request, conflict, not_found
from ..documents import CONVERTER
from ..store import CatalogModel, NotFound, Store, StoreError
from .claims import ModelFiles, model_claims
from .models import (
    DIRECTORY_ENGINES,
    LIVE_ADAPTER_ENGINES,
    Catalog,
    Claim,
    ModelConfig,
    ProfileConfig,
    model_problems,
    name_clash,
)
from .profile_key import ProfileKey

log = get_logger(__name__)

# What goes into the engine's command line: a change here means the running replica no longer
# matches its profile, so it is replaced. Other fields (replica counts, idle timeout, labels,
# the claim) apply to what runs without restarting it.
_RESTART_FIELDS = ("weights", "model_dir", "engine", "engine_version", "context", "parallel", "args", "env")


class Placement(Protocol):
    """What the service changes in the fleet's reconciler (``fleet.reconciler.Reconciler``): the
    claims it places by, the replicas of a changed profile, and the cordons it follows."""

    claims: dict[str, Claim]
    cordons: set[str]

    def drain_profile_key(self, profile_key: str) -> list[str]: ...
    def wake(self) -> None: ...
    def cordon(self, node_id: str) -> None: ...
    def uncordon(self, node_id: str) -> None: ...


def document_of(model: ModelConfig) -> dict[str, Any]:
    doc: dict[str, Any] = CONVERTER.unstructure(model)
    return doc


def model_from_document(doc: Mapping[str, Any]) -> ModelConfig:
    model: ModelConfig = CONVERTER.structure(dict(doc), ModelConfig)
    return model


def check_model(model: ModelConfig, catalog: Catalog) -> None:
    problems = model_problems(model, catalog.engines)
    if problems:
        field, message = problems[0]
        raise bad_request(field, message)
    clash = name_clash(model, list(catalog.models.values()))
    if clash:
        raise conflict(f"model {model.name!r}: {clash}", field="profiles", code="name_taken")


def stored_models(stored: list[CatalogModel], config_names: set[str], catalog: Catalog) -> list[ModelConfig]:
    """The stored models to add to a catalog built from the config file, and warnings for the rest."""
    usable = []
    for row in stored:
        if row.name in config_names:
            log.warning(
                "model %s is defined in the config file and was also added through the admin API: "
                "the config file's definition is used (remove it from the file to use the stored one)",
                row.name,
            )
            continue
        try:
            model = model_from_document(row.document)
        except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
            log.error(
                "model %s in the store cannot be read (%s): not served; remove it with "
                "`llmgw-control ctl models remove %s`",
                row.name,
                exc,
                row.name,
            )
            continue
        problems = model_problems(model, catalog.engines)
        if problems:
            field, message = problems[0]
            log.error(
                "model %s in the store is not valid with this config (%s: %s): not served; change "
                "it through the admin API or remove it",
                row.name,
                field,
                message,
            )
            continue
        usable.append(model)
    return usable


class ModelService:
    def __init__(
        self,
        catalog: Catalog,
        reconciler: Placement,
        store: Store,
        files: ModelFiles | None,
        config_names: set[str],
        poll_interval: float = 2.0,
    ) -> None:
        self.catalog = catalog
        self.reconciler = reconciler
        self.store = store
        self.files = files
        self.config_names = set(config_names)
        self.poll_interval = poll_interval
        # Store writes and catalog updates in one order, so two concurrent changes to one model
        # cannot land in the store in one order and in the catalog in the other.
        self._lock = trio.Lock()
        # What the catalog holds from the store, as documents: the poll compares against it.
        self._applied: dict[str, dict[str, Any]] = {
            name: document_of(model) for name, model in catalog.models.items() if catalog.source(name) == "api"
        }

    def definition(self, name: str) -> tuple[ModelConfig, str]:
        model = self.catalog.models.get(name)
        if model is None:
            raise not_found("model", name)
        return model, self.catalog.source(name)

    def _refuse_config(self, name: str) -> None:
        if name in self.config_names:
            raise conflict(
                f"model {name!r} is defined in the config file: change it there", field="name", code="defined_in_config"
            )

    async def add(self, model: ModelConfig) -> ModelConfig:
        self._refuse_config(model.name)
        if model.name in self.catalog.models:
            raise conflict(f"model {model.name!r} already exists", field="name")
        check_model(model, self.catalog)
        claims = await model_claims(model, self.files, refuse_hostile=True)
        async with self._lock:
            await self.store.add_model(model.name, document_of(model))
            self._apply(model, claims)
        log.info("model %s added through the admin API", model.name)
        return model

    async def replace(self, name: str, model: ModelConfig) -> ModelConfig:
        if model.name != name:
            raise bad_request("name", f"must be the name in the path ({name!r}); a model cannot be renamed")
        self._refuse_config(name)
        if name not in self.catalog.models:
            # Stored but not served (this daemon could not run it): a fixed definition may replace
            # it. Otherwise the store's NotFound is the 404, before any estimate is made.
            await self.store.get_model(name)
        check_model(model, self.catalog)
        claims = await model_claims(model, self.files, refuse_hostile=True)
        async with self._lock:
            await self.store.update_model(name, document_of(model))
            self._apply(model, claims)
        log.info("model %s changed through the admin API", name)
        return model

    async def remove(self, name: str) -> None:
        self._refuse_config(name)
        async with self._lock:
            try:
                await self.store.delete_model(name)
            except NotFound:
                if name in self.catalog.models:
                    raise  # removed by another daemon since: the poll will catch up
                raise not_found("model", name) from None
            self._forget(name)
        log.info("model %s removed through the admin API", name)

    # ------------------------------------------------------------------ applying

    def _apply(self, model: ModelConfig, claims: dict[str, Claim]) -> None:
        """Put a stored model in the catalog; drain replicas whose profile changed or went away."""
        old = self.catalog.models.get(model.name)
        self.catalog.put(model, "api")
        self._applied[model.name] = document_of(model)
        self.reconciler.claims.update(claims)
        if old is not None:
            new_profiles = {p.name: p for p in model.profiles}
            for profile in old.profiles:
                profile_key = str(ProfileKey(model.name, profile.name))
                new = new_profiles.get(profile.name)
                if new is None:
                    self.reconciler.claims.pop(profile_key, None)
                if new is None or _restart_needed(profile, new):
                    drained = self.reconciler.drain_profile_key(profile_key)
                    if drained:
                        log.info(
                            "model %s changed: draining %d replica(s) of the old definition", profile_key, len(drained)
                        )
        self.reconciler.wake()

    def _forget(self, name: str) -> None:
        model = self.catalog.remove(name)
        self._applied.pop(name, None)
        if model is None:
            return
        for profile in model.profiles:
            profile_key = str(ProfileKey(name, profile.name))
            self.reconciler.drain_profile_key(profile_key)
            self.reconciler.claims.pop(profile_key, None)
        self.reconciler.wake()

    # ------------------------------------------------------------------ other daemons' changes

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow what other control daemons change in the store: models, and cordons (so a node
        cordoned through a standby's API is cordoned on the leader too). Cordons are restored
        before ``started``, so no replica is placed on a cordoned node after a restart."""
        seen_models: int | None = None
        seen_nodes: int | None = None
        try:
            revisions = await self.store.revisions()
            seen_models, seen_nodes = revisions.models, revisions.nodes
            await self.sync()  # anything changed since the catalog was built from the store
            await self.sync_cordons()
        except StoreError as exc:
            log.warning("could not read the stored cordons (retrying): %s", exc)
        task_status.started()
        while True:
            await trio.sleep(self.poll_interval)
            try:
                revisions = await self.store.revisions()
                if revisions.models != seen_models:
                    await self.sync()
                    seen_models = revisions.models
                if revisions.nodes != seen_nodes:
                    await self.sync_cordons()
                    seen_nodes = revisions.nodes
            except StoreError as exc:
                log.warning("could not follow the store's models and nodes (retrying): %s", exc)

    async def sync_cordons(self) -> None:
        """Cordon flags of nodes with a stored identity, as the store says (others stay as set)."""
        for identity in await self.store.list_nodes():
            if identity.cordoned and identity.id not in self.reconciler.cordons:
                self.reconciler.cordon(identity.id)
            elif not identity.cordoned and identity.id in self.reconciler.cordons:
                self.reconciler.uncordon(identity.id)

    async def sync(self) -> None:
        """Make the catalog's API models what the store holds."""
        rows = await self.store.list_models()
        wanted = {
            m.name: m
            for m in stored_models(
                [r for r in rows if document_of_row(r) != self._applied.get(r.name)], self.config_names, self.catalog
            )
        }
        present = {r.name for r in rows}
        claims = {}
        for model in wanted.values():
            claims[model.name] = await model_claims(model, self.files)
        async with self._lock:
            for name in [n for n in self._applied if n not in present]:
                log.info("model %s was removed by another control daemon", name)
                self._forget(name)
            for name, model in wanted.items():
                log.info("model %s was added or changed by another control daemon", name)
                self._apply(model, claims[name])


def document_of_row(row: CatalogModel) -> dict[str, Any]:
    return dict(row.document)


def _restart_needed(old: ProfileConfig, new: ProfileConfig) -> bool:
    # vLLM and SGLang are told their batch size (slots) on their command line; llama.cpp is not.
    directory_engine = new.engine in DIRECTORY_ENGINES and old.slots != new.slots
    # llama-server loads its adapters only at start (--lora), and a request names one by its
    # position there: any change of the list restarts its replicas. vLLM loads and unloads them
    # live (the node's set_adapters), so its replicas keep running -- unless it had none: then it
    # was started without --enable-lora, which only a restart adds.
    if new.engine in LIVE_ADAPTER_ENGINES:
        adapters = not old.adapters and bool(new.adapters)
    else:
        adapters = [a.weights for a in old.adapters] != [a.weights for a in new.adapters]
    return directory_engine or adapters or any(getattr(old, f) != getattr(new, f) for f in _RESTART_FIELDS)
