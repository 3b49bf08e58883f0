from __future__ import annotations

import pytest

from llmgw_dev.fake_hub import FakeHub, FakeRepo


@pytest.fixture
def fake_hub_repos(tiny_gguf: bytes) -> FakeHub:
    return FakeHub(
        repos={
            "acme/tiny-chat-GGUF": FakeRepo(
                files={
                    "tiny-chat.Q8_0.gguf": tiny_gguf,
                    "README.md": b"# tiny\n",
                    "sub/tiny-chat-IQ2_XXS.gguf": tiny_gguf[:1000],
                    "big-00001-of-00002.gguf": b"x" * 10,
                },
                downloads=50,
            ),
            "acme/other-GGUF": FakeRepo(files={"other-F16.gguf": b"GGUF" + b"\0" * 60}, downloads=5),
            "acme/not-gguf": FakeRepo(files={"model.safetensors": b"x"}, tags=["safetensors"]),
        }
    )
