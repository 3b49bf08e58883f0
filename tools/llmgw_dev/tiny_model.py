"""Write a tiny, deterministic GGUF chat model that a real ``llama-server`` runs.

Nothing available offline ships a small chat model, and tests must not download one. So we
generate it: a ``llama`` architecture with 64-wide embeddings and 2 layers (~150k parameters,
~0.3 MB), seeded random weights, a byte-level GPT-2 BPE tokenizer whose merges are learned
deterministically from a built-in text, and a ChatML chat template so ``/v1/chat/completions``
works. The output is gibberish, but it is valid single-line printable ASCII (see
``_printable_bias``) and the file is byte-for-byte identical on every run with pinned numpy/gguf.

The model never emits its end-of-sequence token: callers must send ``max_tokens`` (the answer ends
with ``finish_reason == "length"``) or ``stop``.

Run ``python tools/llmgw_dev/tiny_model.py`` to build (or find) the cached model and print its path.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import numpy.typing as npt

if __package__ in (None, ""):
    # Run as a script: make ``llmgw_dev`` importable the same way pytest's pythonpath does.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw_dev.build_engine import cache_dir, cache_lock

MODEL_NAME = "tiny-chat.gguf"
SEED = 20261202

N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
N_CTX = 2048
N_VOCAB = 512

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
N_MERGES = N_VOCAB - 256 - len(CONTROL_TOKENS)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The merges are learned from this text. Any fixed text works; English prose gives merges that
# make ordinary prompts tokenize to fewer tokens, which keeps prompt token counts small and stable.
_CORPUS = (
    """
The gateway accepts a request, checks the key, admits it against the quota of its group, picks a
ready replica of the model and streams the answer back to the client without buffering it. When no
replica runs, the activator holds the request while the reconciler places one on a node that has
room for it. Nodes report what they are and what they run; the control plane decides, and the node
does what it is told. Hello, how are you? Tell me a story about a small model that answers every
question with printable letters. The quick brown fox jumps over the lazy dog. Streaming tokens one
by one, the server sends an event for each token, then the usage, then done. Please say hello to
the tests, the bench and the demo, and thank you for the time and the attention you give them.
"""
    * 3
)


# Byte-level BPE (as in GPT-2): every byte maps to one printable unicode character, so token
# strings and merges never contain spaces or control characters.
def _bytes_to_unicode() -> dict[int, str]:
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

# GPT-2's pre-tokenizer splits words with their leading space; llama.cpp's "gpt-2" pre-tokenizer
# does the same, so the merges we learn here are the ones it applies.
_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+""")


def learn_merges(text: str, count: int) -> list[tuple[str, str]]:
    """Classic BPE training; ties go to the lexicographically smallest pair, so it is deterministic."""
    words = Counter(_PRETOKENIZE.findall(text))
    splits: dict[tuple[str, ...], int] = {}
    for word, freq in words.items():
        key = tuple(BYTE_TO_CHAR[b] for b in word.encode("utf-8"))
        splits[key] = splits.get(key, 0) + freq
    merges: list[tuple[str, str]] = []
    for _ in range(count):
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, freq in splits.items():
            for pair in itertools.pairwise(symbols):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs.items(), key=lambda item: (-item[1], item[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        updated: dict[tuple[str, ...], int] = {}
        for symbols, freq in splits.items():
            out: list[str] = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            updated[tuple(out)] = updated.get(tuple(out), 0) + freq
        splits = updated
    if len(merges) < count:
        raise RuntimeError(f"the corpus yields only {len(merges)} merges, {count} wanted")
    return merges


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types (1 normal, 3 control) and merges in GGUF's ``"a b"`` form."""
    merges = learn_merges(_CORPUS, N_MERGES)
    tokens = [BYTE_TO_CHAR[b] for b in range(256)] + [a + b for a, b in merges] + list(CONTROL_TOKENS)
    types = [1] * (256 + len(merges)) + [3] * len(CONTROL_TOKENS)
    assert len(tokens) == N_VOCAB and len(set(tokens)) == N_VOCAB
    return tokens, types, [f"{a} {b}" for a, b in merges]


def _is_printable_single_line(token: str) -> bool:
    raw = bytes(CHAR_TO_BYTE[c] for c in token)
    return all(0x20 <= b <= 0x7E for b in raw)


def _printable_bias(tokens: list[str], types: list[int]) -> npt.NDArray[np.float32]:
    """+1 for tokens that decode to printable ASCII without a newline, -1 for every other token.

    Random weights would sample arbitrary bytes (invalid UTF-8, control characters) and the
    control tokens. Instead the last embedding column is a constant 1 for every token and no layer
    writes to it, so it reaches the output matrix untouched (only rescaled by the final RMS norm);
    the output matrix reads that column as a per-token bias that dominates the random logits.
    """
    return np.array(
        [1.0 if t == 1 and _is_printable_single_line(tok) else -1.0 for tok, t in zip(tokens, types, strict=True)],
        dtype=np.float32,
    )


def _tensors() -> list[tuple[str, npt.NDArray[np.float16] | npt.NDArray[np.float32]]]:
    rng = np.random.default_rng(SEED)
    tokens, types, _ = vocabulary()
    bias_col = N_EMBD - 1

    def mat(rows: int, cols: int, scale: float) -> npt.NDArray[np.float32]:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def f16(a: npt.NDArray[np.float32]) -> npt.NDArray[np.float16]:
        return a.astype(np.float16)

    # numpy shapes are (out, in); gguf reverses them into ggml's (in, out) order.
    embd = mat(N_VOCAB, N_EMBD, 0.5)
    embd[:, bias_col] = 1.0
    out: list[tuple[str, npt.NDArray[np.float16] | npt.NDArray[np.float32]]] = [
        ("token_embd.weight", f16(embd)),
    ]
    ones = np.ones(N_EMBD, dtype=np.float32)
    for layer in range(N_LAYER):
        wo = mat(N_EMBD, N_EMBD, 0.1)
        wo[bias_col, :] = 0.0  # no layer writes to the bias column
        down = mat(N_EMBD, N_FF, 0.1)
        down[bias_col, :] = 0.0
        out += [
            (f"blk.{layer}.attn_norm.weight", ones.copy()),
            (f"blk.{layer}.attn_q.weight", f16(mat(N_EMBD, N_EMBD, 0.2))),
            (f"blk.{layer}.attn_k.weight", f16(mat(N_EMBD, N_EMBD, 0.2))),
            (f"blk.{layer}.attn_v.weight", f16(mat(N_EMBD, N_EMBD, 0.2))),
            (f"blk.{layer}.attn_output.weight", f16(wo)),
            (f"blk.{layer}.ffn_norm.weight", ones.copy()),
            (f"blk.{layer}.ffn_gate.weight", f16(mat(N_FF, N_EMBD, 0.2))),
            (f"blk.{layer}.ffn_up.weight", f16(mat(N_FF, N_EMBD, 0.2))),
            (f"blk.{layer}.ffn_down.weight", f16(down)),
        ]
    output = mat(N_VOCAB, N_EMBD, 0.3)
    # After the final RMS norm the constant column is roughly 1/rms(x) ~ 0.5..2; a weight of 40
    # puts allowed tokens tens of logits above the rest, so sampling never leaves printable ASCII.
    output[:, bias_col] = 40.0 * _printable_bias(tokens, types)
    out += [("output_norm.weight", ones.copy()), ("output.weight", f16(output))]
    return out


def write_model(path: Path) -> Path:
    """Write the model to ``path`` (atomically: a temporary file in the same folder, then rename)."""
    import gguf  # imported here: only model writers need it, and it is slow to import

    tokens, types, merges = vocabulary()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tiny-", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp_name, "llama")
        writer.add_name("llmgw tiny chat")
        writer.add_context_length(N_CTX)
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(N_LAYER)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD_KV)
        writer.add_rope_dimension_count(N_EMBD // N_HEAD)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(N_VOCAB)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        endoftext, _, im_end = (tokens.index(t) for t in CONTROL_TOKENS)
        writer.add_bos_token_id(endoftext)
        writer.add_pad_token_id(endoftext)
        writer.add_eos_token_id(im_end)
        writer.add_eot_token_id(im_end)
        writer.add_add_bos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)
        for name, data in _tensors():
            writer.add_tensor(name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp_name, 0o644)  # mkstemp makes it 0600; the node may serve it to other users
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def model_path() -> Path:
    return cache_dir() / "models" / MODEL_NAME


def ensure_model() -> Path:
    """Return the cached model, writing it first when missing (concurrent callers wait on a lock)."""
    path = model_path()
    with cache_lock("model"):
        if not path.exists():
            write_model(path)
    return path


def main() -> int:
    print(ensure_model())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
