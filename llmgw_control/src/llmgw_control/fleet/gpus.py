"""Placing a replica's VRAM claim on specific GPUs of a node, never over-committing any of them.

A node with eight 24 GB GPUs is not a 192 GB GPU: a claim is fitted on one GPU (or split in equal
shares over several, for a profile that asks for tensor split), and each GPU's free memory is
its own total minus the shares placed on it.
"""

from __future__ import annotations

from collections.abc import Iterable


def share(vram_mib: int, count: int) -> int:
    """Each GPU's share of a claim split over ``count`` GPUs (rounded up: never under-claimed)."""
    return -(-vram_mib // max(count, 1))


def free_per_gpu(gpus: Iterable[tuple[int, int]], held: Iterable[tuple[tuple[int, ...], int]]) -> dict[int, int]:
    """Free MiB per GPU index: ``gpus`` are (index, total MiB); ``held`` are (devices, VRAM MiB) of
    the replicas there. A replica whose devices are not known (adopted from before devices were
    recorded) is counted on every GPU in equal shares."""
    free = dict(gpus)
    for devices, vram in held:
        if vram <= 0 or not free:
            continue
        on = [d for d in devices if d in free] or sorted(free)
        for device in on:
            free[device] -= share(vram, len(on))
    return free


def fit(free: dict[int, int], vram_mib: int, count: int) -> tuple[int, ...] | None:
    """The GPUs a claim of ``vram_mib`` split over ``count`` goes on, or None when it fits on none.

    Best fit: the GPUs with the least free memory that still hold a share, so a large free GPU is
    kept for a large model rather than nibbled at by small ones.
    """
    need = share(vram_mib, count)
    fitting = sorted((mib, index) for index, mib in free.items() if mib >= need)
    if len(fitting) < count:
        return None
    return tuple(sorted(index for _, index in fitting[:count]))
