"""AMD and Vulkan GPUs in the node's facts: a recorded sysfs tree, the Vulkan probe's JSON, and
the real Vulkan loader of this machine (Mesa's lavapipe, a software device, when installed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmgw_node import gpu_probe
from llmgw_node.engines.release import platform_for
from llmgw_node.probe import probe
from llmgw_node.vulkan_devices import enumerate_devices


def _amd_card(sys_root: Path, card: str, vram: int, used: int, name: str = "") -> None:
    device = sys_root / "class" / "drm" / card / "device"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x1002\n")
    (device / "device").write_text("0x74a1\n")
    (device / "mem_info_vram_total").write_text(f"{vram}\n")
    (device / "mem_info_vram_used").write_text(f"{used}\n")
    if name:
        (device / "product_name").write_text(name + "\n")


def test_amd_gpus_come_from_kfd_and_the_amdgpu_cards(tmp_path: Path) -> None:
    dev, sys_root = tmp_path / "dev", tmp_path / "sys"
    dev.mkdir()
    _amd_card(sys_root, "card1", 192 << 30, 1 << 30, "AMD Instinct MI300X")
    _amd_card(sys_root, "card10", 64 << 30, 0)
    (sys_root / "class" / "drm" / "card1-DP-1").mkdir()  # a connector, not a card
    other = sys_root / "class" / "drm" / "card0" / "device"
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x1a03\n")  # a BMC's display adapter
    assert gpu_probe.probe_amd(str(dev), str(sys_root)) == []  # no /dev/kfd: no ROCm
    (dev / "kfd").write_text("")
    gpus = gpu_probe.probe_amd(str(dev), str(sys_root))
    assert [(g.index, g.name, g.memory_total_mib, g.memory_free_mib) for g in gpus] == [
        (0, "AMD Instinct MI300X", 196608, 195584),
        (1, "AMD GPU 0x74a1", 65536, 65536),
    ]


DEVICES = json.dumps(
    {
        "devices": [
            {"index": 0, "name": "llvmpipe (LLVM 15.0.6, 256 bits)", "type": "cpu", "memory_mib": 2048},
            {"index": 1, "name": "Intel(R) Arc(tm) A770 Graphics (DG2)", "type": "discrete", "memory_mib": 16032},
        ]
    }
)


def test_software_vulkan_devices_count_only_with_the_test_switch() -> None:
    gpus, problem = gpu_probe.parse_vulkan_devices(DEVICES, software=False)
    assert problem == ""
    assert [(g.index, g.name) for g in gpus] == [(1, "Intel(R) Arc(tm) A770 Graphics (DG2)")]
    gpus, _ = gpu_probe.parse_vulkan_devices(DEVICES, software=True)
    assert [g.index for g in gpus] == [0, 1]


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"devices": [{"index": "0"}]}', '{"devices": 3}'])
def test_hostile_vulkan_probe_output_gives_no_gpus(text: str) -> None:
    assert gpu_probe.parse_vulkan_devices(text, software=True)[0] == []


def test_a_loader_less_node_counts_as_having_a_gpu_only_with_a_render_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drivers = ["intel_icd.x86_64.json", "lvp_icd.x86_64.json", "radeon_icd.x86_64.json"]
    monkeypatch.delenv(gpu_probe.SOFTWARE_GPUS_SWITCH, raising=False)
    assert not gpu_probe.lists_a_gpu(drivers, str(tmp_path))  # Mesa installs every manifest
    (tmp_path / "dri").mkdir()
    (tmp_path / "dri" / "renderD128").write_text("")
    assert gpu_probe.lists_a_gpu(drivers, str(tmp_path))
    assert not gpu_probe.lists_a_gpu([], str(tmp_path))


lavapipe = pytest.mark.skipif(
    not Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json").exists() or shutil.which("ldconfig") is None,
    reason="needs Mesa's lavapipe and the loader",
)


@lavapipe
def test_the_real_loader_lists_lavapipe_as_a_cpu_device() -> None:
    devices = enumerate_devices()
    assert any(d["type"] == "cpu" and "llvmpipe" in str(d["name"]) for d in devices), devices


@lavapipe
async def test_a_node_whose_only_gpu_is_lavapipe_reports_it_with_the_switch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi
    monkeypatch.delenv(gpu_probe.SOFTWARE_GPUS_SWITCH, raising=False)
    facts = await probe(tmp_path)
    assert (facts.gpus, facts.gpu_backends, facts.gpus_unusable) == ([], [], "")
    monkeypatch.setenv(gpu_probe.SOFTWARE_GPUS_SWITCH, "1")
    facts = await probe(tmp_path)
    assert facts.gpu_backend == "vulkan" and facts.gpu_backends == ["vulkan"]
    assert "llvmpipe" in facts.gpus[0].name
    assert platform_for(facts).vulkan
    # The loader removed: the driver is still there, the node says it cannot reach it.
    monkeypatch.setenv(gpu_probe.VULKAN_LOADER_SWITCH, "libvulkan-removed.so.1")
    facts = await probe(tmp_path)
    assert facts.gpus == [] and facts.gpu_backends == []
    assert "the Vulkan loader (libvulkan-removed.so.1) is not: install it" in facts.gpus_unusable
    plat = platform_for(facts)
    assert plat.has_gpus and not plat.vulkan


def test_nvidia_hardware_on_the_pci_bus_is_seen_whatever_the_driver_says(tmp_path: Path) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    for slot, vendor, klass in (("0000:00:01.0", "0x8086", "0x060000"), ("0000:3b:00.0", "0x10de", "0x068000")):
        (devices / slot).mkdir(parents=True)
        (devices / slot / "vendor").write_text(vendor + "\n")
        (devices / slot / "class").write_text(klass + "\n")
    assert not gpu_probe.nvidia_on_pci(str(tmp_path))  # an NVIDIA bridge is no GPU
    (devices / "0000:65:00.0").mkdir()
    (devices / "0000:65:00.0" / "vendor").write_text("0x10de\n")
    (devices / "0000:65:00.0" / "class").write_text("0x030200\n")  # 3D controller: an H100, an L4
    assert gpu_probe.nvidia_on_pci(str(tmp_path))
