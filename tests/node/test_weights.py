"""Model weights: resumable, verified, shared, removable, and refused when the disk is too small."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx2
import pytest
import trio
from node.release_server import FileServer

from llmgw_node.weights import WeightsCache, WeightsError
from llmgw_shared.wire import WeightsSpec

DATA = os.urandom(3 << 20)
SHA = hashlib.sha256(DATA).hexdigest()


def spec(files: FileServer, name: str = "model.gguf", data: bytes = DATA, sha: str = SHA) -> WeightsSpec:
    return WeightsSpec(url=files.add_file(name, data), sha256=sha, size=len(data))


async def test_download_is_verified_and_cached(tmp_path: Path, files: FileServer) -> None:
    progress: list[str] = []
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)
        path = await cache.ensure(spec(files), progress.append)
        assert path == tmp_path / "weights" / SHA
        assert await trio.Path(path).read_bytes() == DATA
        assert progress[-1] == "downloading model.gguf (3 MB, 100%)"
        # A second ask is served from the cache.
        await cache.ensure(spec(files))
    assert len(files.requests) == 1


async def test_interrupted_download_resumes_with_range(tmp_path: Path, files: FileServer) -> None:
    s = spec(files)
    files.cut_after["/files/model.gguf"] = 1 << 20
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)
        with pytest.raises(WeightsError):
            await cache.ensure(s)
        part = tmp_path / "weights" / f"{SHA}.part"
        assert 0 < (await trio.Path(part).stat()).st_size <= 1 << 20
        have = (await trio.Path(part).stat()).st_size
        path = await cache.ensure(s)
    assert await trio.Path(path).read_bytes() == DATA
    assert files.requests == [("/files/model.gguf", ""), ("/files/model.gguf", f"bytes={have}-")]


async def test_wrong_sha256_is_refused_and_nothing_is_kept(tmp_path: Path, files: FileServer) -> None:
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)
        with pytest.raises(WeightsError) as info:
            await cache.ensure(spec(files, sha="f" * 64))
    assert f"sha256 {SHA} differs from the published {'f' * 64}" in str(info.value)
    assert list((tmp_path / "weights").iterdir()) == []


async def test_two_replicas_share_one_download(tmp_path: Path, files: FileServer) -> None:
    s = spec(files)
    paths: list[Path] = []
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)

        async def one() -> None:
            paths.append(await cache.ensure(s))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
    assert paths[0] == paths[1]
    assert len(files.requests) == 1


async def test_a_disk_too_full_is_refused_before_downloading(tmp_path: Path, files: FileServer) -> None:
    async with httpx2.AsyncClient() as client:
        # Ask to keep more free than any test disk has, so the precheck must refuse.
        cache = WeightsCache(tmp_path, client, margin=1 << 60)
        with pytest.raises(WeightsError) as info:
            await cache.ensure(spec(files))
    assert str(info.value).startswith("not enough disk for model.gguf: needs ")
    assert files.requests == []


async def test_remove_keeps_files_in_use(tmp_path: Path, files: FileServer) -> None:
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)
        path = await cache.ensure(spec(files))
    cache.acquire(SHA, "shard-a")
    cache.acquire(SHA, "shard-b")
    assert cache.remove([SHA]) == ([], [SHA])
    cache.give_back(SHA, "shard-a")
    assert cache.remove([SHA.upper()]) == ([], [SHA])
    cache.give_back(SHA, "shard-b")
    assert cache.remove([SHA]) == ([SHA], [])
    assert not path.exists()


async def test_local_path_is_checked_and_used_in_place(tmp_path: Path) -> None:
    model = tmp_path / "mine.gguf"
    model.write_bytes(DATA)
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)
        assert await cache.ensure(WeightsSpec(url=str(model), sha256=SHA, size=len(DATA))) == model
        with pytest.raises(WeightsError, match="expected 5"):
            await cache.ensure(WeightsSpec(url=str(model), sha256="a" * 64, size=5))
        with pytest.raises(WeightsError, match="not 64 hex digits"):
            await cache.ensure(WeightsSpec(url=str(model), sha256="abc", size=5))
    # The operator's own file is never the node's to delete.
    cache.remove([SHA])
    assert model.exists()


@pytest.mark.parametrize("name", ["../victim", "../victim\n", "x/../../victim", "", "sha256:" + "a" * 64])
async def test_remove_refuses_anything_but_a_digest(tmp_path: Path, name: str) -> None:
    # The digest is the file's name under weights/: '../victim' would name a file outside.
    victim = tmp_path / "victim"
    victim.write_text("the operator's")
    (tmp_path / "weights").mkdir()
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)
        with pytest.raises(WeightsError, match=r"^remove_weights: sha256 .* is not valid: use 64 hex digits$"):
            cache.remove([SHA, name])
    assert victim.exists()


async def test_a_url_that_is_no_file_name_is_shown_by_its_digest(tmp_path: Path, files: FileServer) -> None:
    progress: list[str] = []
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)
        await cache.ensure(spec(files, name="model(1).gguf"), progress.append)
    assert progress[-1] == f"downloading {SHA[:12]} (3 MB, 100%)"


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/a\nb.gguf", "http://[::1/x.gguf", "gopher://127.0.0.1/x.gguf"])
async def test_a_url_httpx_cannot_use_is_a_refusal(tmp_path: Path, url: str) -> None:
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0)
        with pytest.raises(WeightsError):
            await cache.ensure(WeightsSpec(url=url, sha256=SHA, size=len(DATA)))


async def test_a_file_gaining_or_losing_its_last_user_is_announced(tmp_path: Path) -> None:
    # The node lists the cache again on this call: a replica's "stopped" report goes out before its
    # file's hold was given back, and a listing made then said "in use" until the next minute's listing.
    calls: list[bool] = []
    async with httpx2.AsyncClient() as client:
        cache = WeightsCache(tmp_path, client, margin=0, on_use_change=lambda: calls.append(cache.in_use(SHA)))
        cache.acquire(SHA, "a")
        cache.acquire(SHA, "b")
        assert calls == [True]
        cache.give_back(SHA, "a")
        assert calls == [True]
        cache.give_back(SHA, "b")
        assert calls == [True, False]
        cache.give_back(SHA, "b")  # given back twice (a stop racing a crash): nothing new to say
        assert calls == [True, False]
