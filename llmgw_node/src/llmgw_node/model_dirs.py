"""Model directories for vLLM and SGLang: where a profile's ``model_dir`` is, and whether it may be.

A profile names a directory (a Hugging Face snapshot: config.json, tokenizer, safetensors) rather
than one sha256-checked file. Control says where; the node decides whether that is allowed: the
directory must resolve (symlinks followed) inside one of the node's ``model_roots`` or its Hub
cache, so a profile cannot point an engine at /etc or another user's home. Two forms:

* an absolute path: ``/srv/models/Qwen2.5-0.5B-Instruct`` (no ``..`` components);
* ``hub:ORG/NAME[@REVISION]``: a snapshot in the node's Hub cache, laid out as the Hub's client
  lays it out (``models--ORG--NAME/snapshots/<commit>``, ``refs/<branch>`` naming the commit), so a
  cache filled by ``huggingface-cli download`` or copied from another machine is used as it is.
  REVISION is a branch or tag with a ref in the cache, or a commit; the default is ``main``.

Nothing is downloaded here: a snapshot the cache lacks is a failed start that says so.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import attrs

# The Hub's repository names: an owner and a name of letters, digits, '-', '_' and '.'.
HUB_DIR = re.compile(
    r"^hub:([A-Za-z0-9][A-Za-z0-9._\-]{0,95})/([A-Za-z0-9][A-Za-z0-9._\-]{0,95})"
    r"(?:@([A-Za-z0-9][A-Za-z0-9._\-]{0,95}))?$"
)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A path longer than this is not a model directory anyone wrote by hand (PATH_MAX is 4096).
MAX_PATH = 1024


class ModelDirError(Exception):
    """A model directory that is malformed, missing, or outside the node's roots; the text says which."""


def check_model_dir(value: str) -> None:
    """The form alone (control checks it when a profile is written; the node again before use)."""
    if not value:
        raise ModelDirError("model_dir is empty")
    if len(value) > MAX_PATH or any(c < " " or c == "\x7f" for c in value):
        raise ModelDirError("model_dir must be a path of printable characters, at most 1024")
    if value.startswith("hub:"):
        if not HUB_DIR.fullmatch(value):
            raise ModelDirError(f"{value!r} is not hub:ORG/NAME[@REVISION]")
        return
    if not value.startswith("/"):
        raise ModelDirError(f"{value!r} is neither an absolute path nor hub:ORG/NAME[@REVISION]")
    if ".." in Path(value).parts:
        raise ModelDirError(f"{value!r} has a '..' component")


@attrs.frozen
class ModelRoots:
    """Where model directories may be on this node."""

    roots: tuple[Path, ...]
    hub_cache: Path

    def resolve(self, value: str) -> Path:
        """The real directory ``value`` names, or ``ModelDirError`` saying why it cannot be used."""
        check_model_dir(value)
        if value.startswith("hub:"):
            match = HUB_DIR.fullmatch(value)
            assert match is not None
            owner, name, revision = match[1], match[2], match[3] or "main"
            repo = self.hub_cache / f"models--{owner}--{name}"
            commit = revision
            ref = repo / "refs" / revision
            if ref.is_file():
                commit = ref.read_text(errors="replace").strip()
            if not _COMMIT.fullmatch(commit):
                raise ModelDirError(
                    f"{value}: the Hub cache {self.hub_cache} has no snapshot of {owner}/{name} "
                    f"at {revision} (put one there with huggingface-cli download)"
                )
            path = repo / "snapshots" / commit
        else:
            path = Path(value)
        try:
            real = Path(os.path.realpath(path, strict=True))
        except OSError:
            raise ModelDirError(f"{value}: {path} does not exist on this node") from None
        if not real.is_dir():
            raise ModelDirError(f"{value}: {real} is not a directory")
        allowed = [Path(os.path.realpath(root)) for root in (*self.roots, self.hub_cache)]
        if not any(real == root or real.is_relative_to(root) for root in allowed):
            raise ModelDirError(
                f"{value}: {real} is outside this node's model_roots ({', '.join(str(r) for r in allowed)})"
            )
        return real
