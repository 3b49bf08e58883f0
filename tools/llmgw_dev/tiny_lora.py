"""Write tiny LoRA adapters (GGUF) for the tiny model (tools/llmgw_dev/tiny_model.py).

Each adapter changes only the output layer, and only through the tiny model's constant bias
column (the last embedding column is 1 for every token and reaches the output matrix untouched,
roughly 0.5..2 after the final norm): its A picks that column, its B adds ``BOOST`` to one
token's logit per unit of it. Applied at scale 1 that token wins every step, so an answer made
with the adapter is that token repeated; without it (scale 0) the model answers as it always does.
Two adapters with different tokens tell at a glance which one a request got.

Run ``python tools/llmgw_dev/tiny_lora.py`` to write the two test adapters into a folder and
print their paths.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw_dev.tiny_model import BYTE_TO_CHAR, N_EMBD, vocabulary

# Added to the chosen token's logit per unit of the bias column: the base model keeps its
# printable tokens about 40 units above the rest, so 200 makes the chosen one win outright.
BOOST = 200.0
# The two test adapters' tokens: single bytes no ordinary answer of the tiny model is made of
# alone, so a run of one of them is the adapter's mark.
TOKENS = {"tiny-lora-x": "X", "tiny-lora-q": "Q"}


def token_id(char: str) -> int:
    """The tiny model's token for one ASCII character (its byte tokens come first, in byte order)."""
    tokens, _, _ = vocabulary()
    return tokens.index(BYTE_TO_CHAR[ord(char)])


def write_adapter(path: Path, char: str) -> Path:
    """A LoRA adapter that makes the tiny model answer ``char`` repeated (atomically written)."""
    import gguf  # only adapter writers need it, and it is slow to import

    tokens, _, _ = vocabulary()
    # numpy shapes are (out, in); gguf reverses them into ggml's order. Rank 1.
    lora_a = np.zeros((1, N_EMBD), dtype=np.float32)
    lora_a[0, N_EMBD - 1] = 1.0
    lora_b = np.zeros((len(tokens), 1), dtype=np.float32)
    lora_b[token_id(char), 0] = BOOST
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".lora-", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp_name, "llama")
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        # alpha = rank: llama.cpp scales the product by alpha / rank, so 1 here means as written.
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 1.0)
        writer.add_tensor("output.weight.lora_a", lora_a)
        writer.add_tensor("output.weight.lora_b", lora_b)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def write_adapters(folder: Path) -> dict[str, Path]:
    """The test adapters, by name, written into ``folder``."""
    return {name: write_adapter(folder / f"{name}.gguf", char) for name, char in TOKENS.items()}


def main() -> int:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="tiny-lora-"))
    for path in write_adapters(folder).values():
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
