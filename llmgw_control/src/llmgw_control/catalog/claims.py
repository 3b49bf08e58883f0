"""The resource claim of each profile: configured, or estimated from the GGUF header, plus its
LoRA adapters' weights (``adapters_mib``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import attrs
import httpx2
import trio

from llmgw_shared.logs import get_logger
from llmgw_shared.threads import FILES, GGUF

from ..api_errors import bad_request
from .gguf import HeaderRefused, MemoryEstimate, NotGguf, Truncated, estimate_ram, read_metadata
from .models import Catalog, Claim, ModelConfig, ProfileConfig
from .profile_key import ProfileKey

log = get_logger(__name__)


class ModelFiles(Protocol):
    """The model files control serves itself (``fleet.files.FileServer``): their header is read
    from the disk rather than fetched back over HTTP."""

    @property
    def public_url(self) -> str: ...

    def path(self, kind: str, name: str) -> Path | None: ...


MIB = 1 << 20
# The GGUF metadata (and tensor index) of every model we have seen fits in a few MiB.
_HEADER_BYTES = 16 * 1024 * 1024
# Reading a header is CPU work (up to half a second for one that fills the 16 MiB): off the
# event loop, on the gguf thread pool (llmgw_shared/threads.py: two at a time).


class HostileHeader(Exception):
    """The GGUF header of a profile's weights is past a bound of the reader (catalog/gguf.py)."""

    def __init__(self, profile_key: str, refused: HeaderRefused) -> None:
        super().__init__(str(refused))
        self.profile_key = profile_key
        self.refused = refused


async def _header_bytes(profile: ProfileConfig, files: ModelFiles | None) -> bytes | None:
    if profile.weights is None:
        return None
    url = profile.weights.url
    parts = urlsplit(url)
    local: Path | None = None
    if files is not None and url.startswith(files.public_url + "/files/models/"):
        local = files.path("models", url.rsplit("/", 1)[1])
    elif parts.scheme in ("", "file"):
        local = Path(parts.path)
    if local is not None:
        if not local.is_file():
            return None

        def read() -> bytes:
            with open(local, "rb") as handle:
                return handle.read(_HEADER_BYTES)

        return await FILES.run(read, abandon=True)
    async with (
        httpx2.AsyncClient(timeout=10, follow_redirects=True) as client,
        client.stream("GET", url, headers={"range": f"bytes=0-{_HEADER_BYTES - 1}"}) as response,
    ):
        if response.status_code not in (200, 206):
            return None
        # Read no more than the header's share, whatever the server sends: one that ignores
        # Range answers 200 with the whole model (gigabytes), which must not land in memory.
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= _HEADER_BYTES:
                break
        return b"".join(chunks)[:_HEADER_BYTES]


async def estimate_profile(
    profile: ProfileConfig,
    files: ModelFiles | None,
    *,
    refuse_hostile: bool = False,
) -> MemoryEstimate:
    """The profile's RAM estimate. A header the reader refuses raises HeaderRefused with
    ``refuse_hostile`` (a model being added), else is logged and estimated without, like a file
    that is no GGUF (a model already stored must still load)."""
    if profile.weights is None:
        # A model directory (vLLM, SGLang): validation requires its claim to be given.
        return MemoryEstimate(profile.ram_mib, "configured (a model directory has no GGUF header)")
    metadata = None
    try:
        with trio.move_on_after(15):
            data = await _header_bytes(profile, files)
            if data is not None:
                metadata = await GGUF.run(read_metadata, data, abandon=True)
    except HeaderRefused as exc:
        if refuse_hostile:
            raise
        log.warning("GGUF header of %s refused (%s): estimating from the file size", profile.weights.url, exc)
    except (Truncated, NotGguf, OSError, httpx2.HTTPError) as exc:
        log.info("no GGUF metadata for %s (%s): estimating from the file size", profile.weights.url, exc)
    return estimate_ram(metadata, weights_bytes=profile.weights.size, context=profile.context * profile.parallel)


def adapters_mib(profile: ProfileConfig) -> int:
    """The MiB a replica of ``profile`` holds for its LoRA adapters: each one's weights, whole
    (llama-server loads every listed adapter at its start, and vLLM keeps each one loaded until it
    is unloaded), rounded up per file."""
    return sum(-(-adapter.weights.size // MIB) for adapter in profile.adapters)


def with_adapters(claim: Claim, profile: ProfileConfig) -> Claim:
    """``claim`` (the base model's, configured or estimated) plus the adapters' weights, where the
    model's weights are: in GPU memory when the profile claims some, else in RAM. A configured
    claim is the base model's: adapters added later must not overcommit a node it was sized for."""
    extra = adapters_mib(profile)
    if not extra:
        return claim
    if claim.vram_mib:
        return attrs.evolve(claim, vram_mib=claim.vram_mib + extra)
    return attrs.evolve(claim, ram_mib=claim.ram_mib + extra)


async def claims_of(
    profiles: Iterable[tuple[str, ProfileConfig]], files: ModelFiles | None, *, refuse_hostile: bool = False
) -> dict[str, Claim]:
    """The claim of each (profile key, profile), the estimates made side by side; with ``refuse_hostile``
    a header past the reader's bounds raises HostileHeader (for the first such profile given)."""
    claims: dict[str, Claim] = {}
    hostile: dict[str, HeaderRefused] = {}

    async def one(profile_key: str, profile: ProfileConfig) -> None:
        if profile.ram_mib or profile.weights is None:
            claims[profile_key] = with_adapters(Claim(profile.ram_mib, profile.vram_mib), profile)
            return
        try:
            estimate = await estimate_profile(profile, files, refuse_hostile=refuse_hostile)
        except HeaderRefused as exc:
            hostile[profile_key] = exc  # raised below the nursery: one error, not a group of them
            return
        claims[profile_key] = with_adapters(Claim(estimate.ram_mib, profile.vram_mib), profile)
        log.info("model %s claims %d MiB RAM (%s)", profile_key, claims[profile_key].ram_mib, estimate.how)

    given = list(profiles)
    async with trio.open_nursery() as nursery:
        for profile_key, profile in given:
            nursery.start_soon(one, profile_key, profile)
    for profile_key, _ in given:
        if profile_key in hostile:
            raise HostileHeader(profile_key, hostile[profile_key])
    return claims


async def profile_claims(catalog: Catalog, files: ModelFiles | None) -> dict[str, Claim]:
    """The claim of every profile in the catalog."""
    return await claims_of(((r.profile_key, r.profile) for r in catalog.all_profiles()), files)


async def model_claims(
    model: ModelConfig,
    files: ModelFiles | None,
    *,
    refuse_hostile: bool = False,
) -> dict[str, Claim]:
    """The claim of each profile of ``model``. With ``refuse_hostile`` (the admin API adding or
    changing it) a weights file whose GGUF header is past the reader's bounds is a 400 naming
    the profile's weights and the header field."""
    profile_keys = [str(ProfileKey(model.name, p.name)) for p in model.profiles]
    try:
        return await claims_of(zip(profile_keys, model.profiles, strict=True), files, refuse_hostile=refuse_hostile)
    except HostileHeader as exc:
        index = profile_keys.index(exc.profile_key)
        raise bad_request(
            f"profiles[{index}].weights.url",
            f"the GGUF header is refused ({exc.refused}): not a model llmgw will read",
            code="invalid_gguf_header",
        ) from None
