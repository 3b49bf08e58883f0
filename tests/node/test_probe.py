"""Host facts from recorded /proc samples and a fake nvidia-smi on PATH (no GPU on this machine)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmgw_node.probe import NO_AVX2_WARNING, parse_cpuinfo, parse_meminfo, parse_os_release, probe, warnings_for

SAMPLES = Path(__file__).parent / "samples"


@pytest.mark.parametrize(
    ("sample", "arch", "model", "cores", "features"),
    [
        ("cpuinfo-epyc-avx2.txt", "x86_64", "AMD EPYC 7B13", 2, ["avx", "avx2", "fma", "f16c"]),
        ("cpuinfo-qemu64.txt", "x86_64", "QEMU Virtual CPU version 2.5+", 1, []),
        (
            "cpuinfo-xeon-avx512.txt",
            "x86_64",
            "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
            1,
            ["avx", "avx2", "avx512f", "fma", "f16c"],
        ),
        ("cpuinfo-graviton3.txt", "aarch64", "", 2, ["neon", "asimd", "sve"]),
    ],
)
def test_cpuinfo_samples(sample: str, arch: str, model: str, cores: int, features: list[str]) -> None:
    assert parse_cpuinfo((SAMPLES / sample).read_text(), arch) == (model, cores, features)


def test_avx2_warning_only_on_x86_without_it() -> None:
    assert warnings_for("x86_64", []) == [NO_AVX2_WARNING]
    assert "a VM CPU type is the usual cause" in NO_AVX2_WARNING
    assert warnings_for("x86_64", ["avx", "avx2"]) == []
    assert warnings_for("aarch64", ["neon"]) == []


def test_meminfo_and_os_release() -> None:
    assert parse_meminfo((SAMPLES / "meminfo.txt").read_text()) == (24105, 19659)
    osr = parse_os_release((SAMPLES / "os-release-ubuntu.txt").read_text())
    assert (osr["ID"], osr["NAME"], osr["VERSION_ID"]) == ("ubuntu", "Ubuntu", "22.04")


def _proc_root(tmp_path: Path, cpuinfo: str) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    shutil.copy(SAMPLES / cpuinfo, root / "cpuinfo")
    shutil.copy(SAMPLES / "meminfo.txt", root / "meminfo")
    return root


def _fake_nvidia_smi(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return bindir


async def test_probe_with_two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = _fake_nvidia_smi(
        tmp_path,
        """
case "$*" in
  *--query-gpu=index,name,uuid,memory.total,memory.free,driver_version*--format=csv,noheader,nounits*)
    echo '0, NVIDIA L4, GPU-5a1b2c3d-0000-1111-2222-333344445555, 23034, 22700, 550.54.15'
    echo '1, NVIDIA L4, GPU-6b1b2c3d-0000-1111-2222-333344445555, 23034, 1024, 550.54.15'
    ;;
  *) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
""",
    )
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    facts = await probe(
        tmp_path / "data",
        proc_root=str(_proc_root(tmp_path, "cpuinfo-epyc-avx2.txt")),
        os_release=str(SAMPLES / "os-release-ubuntu.txt"),
    )
    assert facts.probed and facts.probed_at > 0
    assert facts.nvidia_driver == "550.54.15"
    assert [(g.index, g.name, g.memory_total_mib, g.memory_free_mib) for g in facts.gpus] == [
        (0, "NVIDIA L4", 23034, 22700),
        (1, "NVIDIA L4", 23034, 1024),
    ]
    assert facts.gpus[0].uuid == "GPU-5a1b2c3d-0000-1111-2222-333344445555"
    assert (facts.os_id, facts.os_version, facts.cpu_model, facts.cores) == ("ubuntu", "22.04", "AMD EPYC 7B13", 2)
    assert facts.ram_total_mib == 24105 and facts.disk_free_mib > 0
    assert facts.warnings == []


async def test_probe_with_tools_but_no_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = _fake_nvidia_smi(
        tmp_path,
        """
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
""",
    )
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    facts = await probe(tmp_path, proc_root=str(_proc_root(tmp_path, "cpuinfo-qemu64.txt")))
    assert facts.nvidia_driver is None and facts.gpus == []
    assert facts.warnings == [
        NO_AVX2_WARNING,
        "nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    ]


async def test_probe_without_nvidia_smi_says_no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    facts = await probe(tmp_path, proc_root=str(_proc_root(tmp_path, "cpuinfo-epyc-avx2.txt")))
    # Probed, and none: not "unknown".
    assert facts.probed and facts.gpus == [] and facts.nvidia_driver is None and facts.warnings == []


async def test_garbled_nvidia_smi_output_is_a_warning_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = _fake_nvidia_smi(tmp_path, "echo 'Field \"foo\" is not a valid field to query.'\n")
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    facts = await probe(tmp_path, proc_root=str(_proc_root(tmp_path, "cpuinfo-epyc-avx2.txt")))
    assert facts.gpus == []
    assert facts.warnings[0].startswith("nvidia-smi output not understood: nvidia-smi line has 1 fields")
