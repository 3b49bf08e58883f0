"""The model mirror's bodies and answers (``mirror_routes``): Hub search, a repository's GGUF
files with their fit on the fleet, and pulls with their progress and draft."""

from __future__ import annotations

from typing import Any

import attrs

from ...catalog import ModelConfig

_TEXT = {"maxLength": 400}


def _text(doc: str, default: str = "") -> Any:
    return attrs.field(default=default, metadata={"schema": _TEXT, "doc": doc})


@attrs.frozen
class HubRepoView:
    id: str
    downloads: int
    likes: int
    updated: str


@attrs.frozen
class HubSearchAnswer:
    endpoint: str
    repos: list[HubRepoView]


@attrs.frozen
class HubFileView:
    path: str
    size: int
    sha256: str
    quantisation: str
    split: bool = attrs.field(metadata={"doc": "one part of a split GGUF (not pulled yet)"})
    estimate_ram_mib: int = attrs.field(metadata={"doc": "a replica's RAM by the file size (no header read)"})
    fits: bool | None = attrs.field(
        metadata={"doc": "whether a replica would be placed on some node now; null without a fleet"}
    )
    fit_detail: str = attrs.field(metadata={"doc": "why not, in placement's words"})


@attrs.frozen
class HubFilesAnswer:
    repo: str
    revision: str
    files: list[HubFileView]


@attrs.frozen
class PullRequest:
    repo: str = _text("A Hub repository (owner/name); with file")
    revision: str = _text("Branch, tag or commit", "main")
    file: str = _text("The .gguf file's path in the repository")
    url: str = attrs.field(
        default="",
        metadata={"schema": {"maxLength": 4096}, "doc": "Instead of repo and file: an https URL on hub.allow_hosts"},
    )
    sha256: str = _text("With url: the file's sha256 (the Hub's LFS digest is used for a repo file)")
    size: int = attrs.field(
        default=0, metadata={"schema": {"minimum": 0}, "doc": "With url: the size in bytes (0: the server's)"}
    )
    model: str = _text("The draft model's name (default: from the file name)")


@attrs.frozen
class PullView:
    id: str
    state: str = attrs.field(
        metadata={
            "doc": "queued, downloading, verifying, ready (a draft waits), published, failed, cancelled or interrupted"
        }
    )
    repo: str
    revision: str
    file: str
    url: str
    name: str = attrs.field(metadata={"doc": "the file in the files directory (models/NAME)"})
    sha256: str
    size: int
    bytes: int
    rate: float = attrs.field(metadata={"doc": "bytes per second over the last seconds"})
    eta_seconds: float | None
    error: str
    draft: ModelConfig | None
    estimate_ram_mib: int
    estimate_how: str


@attrs.frozen
class PullAnswer:
    pull: PullView


@attrs.frozen
class PullList:
    pulls: list[PullView]
