"""The mirror's names from the network, checked in one place: repositories, revisions, file paths,
and the quantisation a GGUF file's name states."""

from __future__ import annotations

import re

from ..api_errors import AdminApiError, bad_request

# The Hub's own rule: owner and name of letters, digits, '-', '_' and '.', at most 96 each.
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}$")
# A branch, tag or commit; '/' allowed (refs/pr/1), '..' never.
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,199}$")
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-+ ()\[\]]{0,199}$")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf\Z", re.IGNORECASE)
# What llama.cpp's quantisations are called in file names (Q4_K_M, IQ2_XXS, Q4_0_4_4, TQ1_0,
# F16, BF16, MXFP4...), matched as a whole dash/dot/underscore-separated part of the name.
_QUANT = re.compile(
    r"(?:^|[-._])((?:I?Q[1-8](?:_[0-9A-Z]+)*)|TQ[12]_0|BF16|F16|F32|FP16|FP32|MXFP4(?:_MOE)?)"
    r"(?=$|[-._])",
    re.IGNORECASE,
)
MAX_SEARCH = 200


def repo_id(value: object, field: str = "repo") -> str:
    if not isinstance(value, str) or not _REPO.fullmatch(value) or ".." in value:
        raise bad_request(field, "a Hub repository is owner/name (letters, digits, '-', '_', '.')")
    return value


def revision(value: object, field: str = "revision") -> str:
    if not isinstance(value, str) or not _REVISION.fullmatch(value) or ".." in value or "//" in value:
        raise bad_request(field, "a revision is a branch, tag or commit (letters, digits, '-', '_', '.', '/')")
    return value


def gguf_path(value: object, field: str = "file") -> str:
    """A GGUF file's path inside a repository: segments without '..', ending in .gguf."""
    if not isinstance(value, str) or len(value) > 400 or not value.lower().endswith(".gguf"):
        raise bad_request(field, "name a .gguf file of the repository")
    if not all(_SEGMENT.fullmatch(part) for part in value.split("/")):
        raise bad_request(field, "a file path is '/'-separated names without '..' or hidden parts")
    if _SPLIT.search(value):
        raise bad_request(field, "split GGUF files (-00001-of-0000N) are not pulled yet: pick a single-file one")
    return value


def search_text(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_SEARCH or any(ord(c) < 0x20 for c in value):
        raise bad_request("q", f"search text is at most {MAX_SEARCH} printable characters")
    return value.strip()


def quantisation(path: str) -> str:
    """The quantisation a GGUF file's name states (``Q4_K_M``), or "" when it names none."""
    stem = path.rsplit("/", 1)[-1][:-5] if path.lower().endswith(".gguf") else path
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else ""


def is_split(path: str) -> bool:
    return _SPLIT.search(path) is not None


__all__ = ["AdminApiError", "gguf_path", "is_split", "quantisation", "repo_id", "revision", "search_text"]
