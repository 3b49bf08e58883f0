"""The model catalog: models, their profiles, and which profile a request means.

A client asks for ``model`` or ``model:profile``. Replicas are registered under the profile's
key (``model:profile``), so two profiles of one model (a GPU build and a CPU fallback, say) are
balanced separately and a client can pin one.
"""

from __future__ import annotations

import math
import re

import attrs

from llmgw_shared.config import ConfigError

from .profile_key import NAME, ProfileKey

SHA256 = re.compile(r"^[0-9a-f]{64}$")
# How the gateway chooses among a model's replicas (gateway/affinity.py): least-loaded, or by the
# request's prefix (its conversation or session) within a load bound, so the engine's KV cache
# of that prefix is reused.
ROUTING_POLICIES = ("least-loaded", "prefix")


@attrs.frozen
class WeightsConfig:
    # An http(s) URL the nodes can reach, or a path on the nodes.
    url: str
    sha256: str
    size: int


@attrs.frozen
class AdapterConfig:
    """A LoRA adapter on a profile's base model, served as a model name of its own: a request for
    ``name`` goes to a replica of the base with this adapter applied and no other."""

    name: str
    # A GGUF LoRA file for llama.cpp (fetched and verified like the base weights); for vLLM a
    # directory on the nodes in ``url`` (a PEFT adapter), which the node checks like a model_dir
    # and does not hash (sha256 and size are then the operator's record only).
    weights: WeightsConfig
    # The adapter's strength when applied (llama.cpp's per-request scale; 1.0: as trained).
    scale: float = 1.0


# Adapters one profile may carry: each is loaded into every replica of the profile (llama-server
# holds them all from its start), so the bound keeps a replica's memory and start time sane.
MAX_ADAPTERS = 64
# A scale beyond this is a typo: LoRA scales are used between 0 and a few.
MAX_ADAPTER_SCALE = 16.0
# The engines that can apply one adapter per request.
ADAPTER_ENGINES = ("llama.cpp", "vllm")
# Those that load and unload adapters while they run (the node's set_adapters): a change of a
# profile's adapters reaches their replicas live. llama-server takes its list at start only, so
# a changed list restarts its replicas (catalog/service.py).
LIVE_ADAPTER_ENGINES = ("vllm",)


# GPUs one replica may be split over: the most one host carries (an HGX board has 8, the
# largest 16), so a larger number is a typo, not a machine.
MAX_GPUS_PER_REPLICA = 16


@attrs.frozen
class ProfileConfig:
    name: str
    # llama.cpp's one model file; vLLM and SGLang name a model_dir instead.
    weights: WeightsConfig | None = None
    engine: str = "llama.cpp"
    # Empty: the version [[engines]] names for this engine.
    engine_version: str = ""
    context: int = 4096
    parallel: int = 4
    # Requests the gateway sends a replica at once; more wait in the gateway's queue, where
    # priorities order them and their number asks for another replica. 0: ``parallel`` (one per
    # llama-server slot); higher only for an engine that batches beyond its slots (vLLM).
    slots: int = 0
    # Extra engine flags, appended after the ones llmgw sets.
    args: list[str] = attrs.Factory(list)
    env: dict[str, str] = attrs.Factory(dict)
    # The resource claim; 0 means estimate RAM from the GGUF header (weights + KV cache).
    ram_mib: int = 0
    vram_mib: int = 0
    # GPUs one replica spreads its VRAM claim over (tensor split): each of them holds an equal
    # share. 1: the whole claim on one GPU.
    gpus: int = 1
    # A profile with a VRAM claim is a GPU profile: it is not placed on a degraded node (one with
    # GPUs that can only run the CPU build) unless this says the CPU is acceptable; there it runs
    # without its GPUs, on RAM.
    cpu_ok: bool = False
    # Only nodes whose engine build carries this GPU backend ("cuda", "rocm", "vulkan", "cpu"; as
    # the node proved it): "" takes whatever build the node chose for its devices.
    backend: str = ""
    min_replicas: int = 0
    max_replicas: int = 1
    # Seconds without traffic after which a replica is drained and stopped; 0 = never.
    idle_timeout: float = 0.0
    # Node labels the replica must run on.
    labels: dict[str, str] = attrs.Factory(dict)
    start_timeout: float = 120.0
    # "least-loaded" or "prefix" (gateway/affinity.py); empty: [router] routing.
    routing: str = ""
    # For vLLM and SGLang: the model directory on the nodes, an absolute path or
    # "hub:ORG/NAME[@REVISION]" (a snapshot in each node's Hub cache); each node checks it is
    # inside its model_roots. Such a profile states its claim (ram_mib and/or vram_mib): there is
    # no GGUF header to estimate it from.
    model_dir: str = ""
    # The latency objective a capacity run is judged by (seconds, p99; 0: none): the highest
    # measured concurrency meeting both becomes the slot count on nodes of the measured kind.
    ttft_target: float = 0.0
    itl_target: float = 0.0
    # What the profile serves (gateway/capabilities.py): routes (chat, completions, embeddings,
    # responses, messages, rerank, tokenize, infill) and features (tools, vision, audio). Empty:
    # learned, from the engine's flags and what its replicas report.
    capabilities: list[str] = attrs.Factory(list)
    # LoRA adapters on this profile's model, each its own model name (AdapterConfig).
    adapters: list[AdapterConfig] = attrs.Factory(list)


# What a profile may list in ``capabilities`` (gateway/capabilities.py reads them).
CAPABILITIES = (
    "chat",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "rerank",
    "tokenize",
    "infill",
    "tools",
    "vision",
    "audio",
)

# A latency objective above ten minutes is a typo (a value in milliseconds), not an objective.
MAX_LATENCY_TARGET = 600.0


def replica_slots(profile: ProfileConfig) -> int:
    """How many requests the gateway sends one replica of ``profile`` at once."""
    return profile.slots or profile.parallel


@attrs.frozen
class ModelConfig:
    name: str
    profiles: list[ProfileConfig]
    # Empty: the first profile.
    default_profile: str = ""


@attrs.frozen
class EngineConfig:
    name: str = "llama.cpp"
    version: str = "b11312"
    # A GitHub-shaped release JSON URL with {version}; empty: control's own file server when it
    # has the archives, else GitHub.
    release_api: str = ""


# A profile's backend pin: a node's llama.cpp build carries one of these (its provenance says which).
BACKENDS = ("", "cuda", "rocm", "vulkan", "cpu")


@attrs.frozen
class Claim:
    """What one replica of a profile holds on its node while it runs (configured, or estimated
    from the weights' GGUF header: ``catalog/claims.py``), so placement knows whether it fits."""

    ram_mib: int
    vram_mib: int = 0


@attrs.frozen
class Resolved:
    model: ModelConfig
    profile: ProfileConfig
    # The adapter a request for an adapter's name means; None: the base model.
    adapter: AdapterConfig | None = None
    # The replicas' profile key, written out (``model:profile``) as the gateway's replica set,
    # metrics and the store key it: an adapter's requests go to its base profile's replicas. Made
    # once, when the catalog indexes its profiles, so a request's lookup builds nothing.
    profile_key: str = attrs.field(init=False)

    @profile_key.default
    def _profile_key(self) -> str:
        return str(ProfileKey(self.model.name, self.profile.name))

    @property
    def name(self) -> str:
        """The model name allow-lists, quotas, usage and metrics count under: the adapter's own
        name for an adapter, else the model's."""
        return self.adapter.name if self.adapter is not None else self.model.name


def model_problems(model: ModelConfig, engines: list[EngineConfig]) -> list[tuple[str, str]]:
    """What is wrong with one model definition, as (field, message) pairs; fields are relative to
    the model (``profiles[0].weights.sha256``), so the config loader and the admin API can each
    say where the model came from."""
    engine_names = sorted({e.name for e in engines})
    problems: list[tuple[str, str]] = []
    if not NAME.fullmatch(model.name):
        problems.append(("name", "a model name uses letters, digits, '.', '_' and '-' (no ':'), at most 96"))
    if not model.profiles:
        problems.append(("profiles", "needs at least one profile"))
    names = [p.name for p in model.profiles]
    if len(set(names)) != len(names):
        problems.append(("profiles", "two profiles share a name"))
    if model.default_profile and model.default_profile not in names:
        problems.append(("default_profile", f"{model.default_profile!r} is not one of {names}"))
    for index, profile in enumerate(model.profiles):
        at = f"profiles[{index}]"
        if not NAME.fullmatch(profile.name):
            problems.append((f"{at}.name", "a profile name uses letters, digits, '.', '_' and '-', at most 96"))
        if profile.engine not in engine_names:
            problems.append((f"{at}.engine", f"{profile.engine!r} is not in [[engines]] ({engine_names})"))
        if profile.engine_version and not any(
            e.name == profile.engine and e.version == profile.engine_version for e in engines
        ):
            problems.append(
                (f"{at}.engine_version", f"{profile.engine} {profile.engine_version!r} is not in [[engines]]")
            )
        problems.extend(_model_problems(profile, at))
        problems.extend(_adapter_problems(profile, at))
        if profile.context < 64:
            problems.append((f"{at}.context", "must be at least 64"))
        if profile.parallel < 1:
            problems.append((f"{at}.parallel", "must be at least 1"))
        if profile.slots < 0:
            problems.append((f"{at}.slots", "must not be negative (0: the profile's parallel)"))
        if profile.backend not in BACKENDS:
            problems.append((f"{at}.backend", f"must be one of {', '.join(repr(b) for b in BACKENDS)}"))
        if not 1 <= profile.gpus <= MAX_GPUS_PER_REPLICA:
            problems.append((f"{at}.gpus", f"must be between 1 and {MAX_GPUS_PER_REPLICA}"))
        if profile.max_replicas < 1:
            problems.append((f"{at}.max_replicas", "must be at least 1"))
        if not 0 <= profile.min_replicas <= profile.max_replicas:
            problems.append((f"{at}.min_replicas", "need 0 <= min_replicas <= max_replicas"))
        if profile.routing and profile.routing not in ROUTING_POLICIES:
            problems.append(
                (f"{at}.routing", f"must be one of {', '.join(ROUTING_POLICIES)} (empty: [router] routing)")
            )
        for field in ("idle_timeout", "ram_mib", "vram_mib", "start_timeout"):
            if getattr(profile, field) < 0:
                problems.append((f"{at}.{field}", "must not be negative"))
        unknown = [c for c in profile.capabilities if c not in CAPABILITIES]
        if unknown or len(set(profile.capabilities)) != len(profile.capabilities):
            problems.append((f"{at}.capabilities", f"each of {', '.join(CAPABILITIES)}, at most once"))
        for field in ("ttft_target", "itl_target"):
            value = getattr(profile, field)
            if not math.isfinite(value) or not 0 <= value <= MAX_LATENCY_TARGET:
                problems.append((f"{at}.{field}", f"must be 0 (no objective) to {MAX_LATENCY_TARGET:.0f} seconds"))
    return problems


# Engines that serve a model directory rather than one file, started by their own conventions.
DIRECTORY_ENGINES = ("vllm", "sglang")
_HUB_DIR = re.compile(
    r"^hub:[A-Za-z0-9][A-Za-z0-9._\-]{0,95}/[A-Za-z0-9][A-Za-z0-9._\-]{0,95}"
    r"(@[A-Za-z0-9][A-Za-z0-9._\-]{0,95})?$"
)


def model_dir_problem(value: str) -> str:
    """What is wrong with a model_dir's form ("" when nothing is); the node checks where it leads."""
    if len(value) > 1024 or any(c < " " or c == "\x7f" for c in value):
        return "must be a path of printable characters, at most 1024"
    if value.startswith("hub:"):
        return "" if _HUB_DIR.fullmatch(value) else "must be hub:ORG/NAME or hub:ORG/NAME@REVISION"
    if not value.startswith("/"):
        return "must be an absolute path on the nodes or hub:ORG/NAME[@REVISION]"
    if ".." in value.split("/"):
        return "must not have a '..' component"
    return ""


def _model_problems(profile: ProfileConfig, at: str) -> list[tuple[str, str]]:
    """The model a profile serves: one file (weights) for llama.cpp, a directory for vLLM and SGLang."""
    problems: list[tuple[str, str]] = []
    if profile.engine in DIRECTORY_ENGINES:
        if profile.weights is not None:
            problems.append((f"{at}.weights", f"{profile.engine} serves a model directory: use model_dir"))
        if not profile.model_dir:
            problems.append((f"{at}.model_dir", f"{profile.engine} needs the model's directory on the nodes"))
        elif problem := model_dir_problem(profile.model_dir):
            problems.append((f"{at}.model_dir", problem))
        if profile.ram_mib <= 0 and profile.vram_mib <= 0:
            problems.append(
                (
                    f"{at}.ram_mib",
                    "a model directory has no GGUF header to estimate from: give ram_mib (and vram_mib on a GPU)",
                )
            )
        return problems
    if profile.model_dir:
        problems.append((f"{at}.model_dir", f"{profile.engine} serves one file: use weights"))
    weights = profile.weights
    if weights is None:
        problems.append((f"{at}.weights", "required: the model file (url, sha256, size)"))
        return problems
    return problems + _weights_problems(weights, f"{at}.weights")


def _weights_problems(weights: WeightsConfig, at: str) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not weights.url.strip():
        problems.append((f"{at}.url", "must be an http(s) URL or a path on the nodes"))
    if not SHA256.fullmatch(weights.sha256):
        problems.append((f"{at}.sha256", "must be 64 lowercase hex digits"))
    if weights.size <= 0:
        problems.append((f"{at}.size", "must be the file size in bytes"))
    return problems


def _adapter_problems(profile: ProfileConfig, at: str) -> list[tuple[str, str]]:
    if not profile.adapters:
        return []
    problems: list[tuple[str, str]] = []
    if profile.engine not in ADAPTER_ENGINES:
        problems.append(
            (
                f"{at}.adapters",
                f"{profile.engine} cannot apply LoRA adapters per request (only {', '.join(ADAPTER_ENGINES)})",
            )
        )
    if len(profile.adapters) > MAX_ADAPTERS:
        problems.append((f"{at}.adapters", f"at most {MAX_ADAPTERS} adapters a profile"))
    names = [a.name for a in profile.adapters]
    if len(set(names)) != len(names):
        problems.append((f"{at}.adapters", "two adapters share a name"))
    for index, adapter in enumerate(profile.adapters[:MAX_ADAPTERS]):
        where = f"{at}.adapters[{index}]"
        if not NAME.fullmatch(adapter.name):
            problems.append(
                (f"{where}.name", "an adapter name uses letters, digits, '.', '_' and '-' (no ':'), at most 96")
            )
        problems.extend(_weights_problems(adapter.weights, f"{where}.weights"))
        if not math.isfinite(adapter.scale) or not 0 < adapter.scale <= MAX_ADAPTER_SCALE:
            problems.append((f"{where}.scale", f"must be above 0 and at most {MAX_ADAPTER_SCALE:g}"))
    return problems


def adapter_names(model: ModelConfig) -> list[str]:
    """The model names a model's adapters are served under."""
    return [a.name for p in model.profiles for a in p.adapters]


def name_clash(model: ModelConfig, others: list[ModelConfig]) -> str:
    """Why ``model``'s names (its own and its adapters') clash with ``others``' ("" when they do
    not): a client's model name must mean one thing."""
    mine = adapter_names(model)
    if len(set(mine)) != len(mine):
        return "two of its profiles' adapters share a name"
    taken: dict[str, str] = {}
    for other in others:
        if other.name == model.name:
            continue
        taken[other.name] = f"the model {other.name!r}"
        for name in adapter_names(other):
            taken[name] = f"an adapter of {other.name!r}"
    if model.name in taken:
        return f"its name is {taken[model.name]}"
    for name in mine:
        if name == model.name or name in taken:
            return f"adapter {name!r} is named like {taken.get(name, 'its model')}"
    return ""


def validate_models(models: list[ModelConfig], engines: list[EngineConfig]) -> None:
    seen: set[str] = set()
    for model in models:
        where = f"models ({model.name!r})"
        if model.name in seen:
            raise ConfigError(f"{where}: declared twice")
        seen.add(model.name)
        problems = model_problems(model, engines)
        if problems:
            field, message = problems[0]
            raise ConfigError(f"{where}.{field}: {message}")
        clash = name_clash(model, models)
        if clash:
            raise ConfigError(f"{where}: {clash}")


class Catalog:
    """The models clients may ask for. Changed at run time by the admin API (``put``/``remove``);
    everything here is synchronous, so a reader in the same trio thread never sees half a change."""

    def __init__(self, models: list[ModelConfig], engines: list[EngineConfig], default_profile: str = "") -> None:
        self.models = {m.name: m for m in models}
        self.engines = list(engines)
        self.default_profile = default_profile
        # Where each model came from: the config file (changed only by editing it) or the API.
        self.sources: dict[str, str] = {m.name: "config" for m in models}
        self._index()

    def put(self, model: ModelConfig, source: str = "api") -> None:
        """Add or replace a model (the caller validated it)."""
        self.models[model.name] = model
        self.sources[model.name] = source
        self._index()

    def remove(self, name: str) -> ModelConfig | None:
        self.sources.pop(name, None)
        model = self.models.pop(name, None)
        self._index()
        return model

    def _index(self) -> None:
        """What each name a client may send means, made when the models change so that resolving
        a request's name is one dict lookup: a model (its default profile), ``model:profile``
        (keyed by the string, so nothing is parsed per request), or an adapter."""
        self._by_profile_key: dict[str, Resolved] = {}
        self._by_model: dict[str, Resolved] = {}
        self._by_adapter: dict[str, Resolved] = {}
        for model in self.models.values():
            names = [p.name for p in model.profiles]
            use_global = self.default_profile in names
            default = self.default_profile if use_global else (model.default_profile or names[0] if names else "")
            for profile in model.profiles:
                resolved = Resolved(model, profile)
                self._by_profile_key[resolved.profile_key] = resolved
                if profile.name == default:
                    self._by_model[model.name] = resolved
                for adapter in profile.adapters:
                    # The first wins, as a scan in the models' order would find it.
                    self._by_adapter.setdefault(adapter.name, Resolved(model, profile, adapter))

    def source(self, name: str) -> str:
        return self.sources.get(name, "config")

    def engine_version(self, profile: ProfileConfig) -> str:
        if profile.engine_version:
            return profile.engine_version
        return next(e.version for e in self.engines if e.name == profile.engine)

    def resolve(self, requested: str) -> Resolved | None:
        """What a client's model name means: a model (its default profile), a ``model:profile``
        key, or an adapter's name; None for anything else (nothing is parsed: each is a lookup)."""
        return self._by_model.get(requested) or self._by_profile_key.get(requested) or self._by_adapter.get(requested)

    def all_profiles(self) -> list[Resolved]:
        return list(self._by_profile_key.values())

    def names(self) -> list[str]:
        """What a client may ask for: each model, and each model:profile."""
        out = []
        for model in self.models.values():
            out.append(model.name)
            out.extend(str(ProfileKey(model.name, p.name)) for p in model.profiles)
            out.extend(adapter_names(model))
        return sorted(out)
