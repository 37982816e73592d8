"""The NVML energy reader finds the board torch trains on, or gives no reading."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from accelbench.system import hardware

BOARDS = {"GPU-aaaa": "board0", "GPU-bbbb": "board1"}  # NVML's order: board0, board1
ENERGY_MJ = {"board0": 1_000, "board1": 250_000}


@pytest.fixture
def nvml(monkeypatch):
    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: None

    def by_uuid(uuid):
        if uuid not in BOARDS:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return BOARDS[uuid]

    module.nvmlDeviceGetHandleByUUID = by_uuid
    module.nvmlDeviceGetHandleByIndex = lambda index: ["board0", "board1"][index]
    module.nvmlDeviceGetTotalEnergyConsumption = lambda handle: ENERGY_MJ[handle]
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def _torch_sees(monkeypatch, uuids: list[str]) -> None:
    props = [types.SimpleNamespace(uuid=u) for u in uuids]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])


def test_reader_follows_the_uuid_when_cuda_visible_devices_reorders(nvml, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    _torch_sees(monkeypatch, ["bbbb"])  # torch's device 0 is NVML's board 1
    assert hardware.gpu_energy_reader(0)() == 250.0


def test_no_reading_rather_than_another_boards(nvml, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    _torch_sees(monkeypatch, ["cccc"])  # a UUID NVML does not know
    assert hardware.gpu_energy_reader(0) is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # no reordering: the index is NVML's too
    assert hardware.gpu_energy_reader(1)() == 250.0


def test_no_nvml_means_no_reading(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert hardware.gpu_energy_reader(0) is None


def test_env_facts_and_the_doctor_share_one_probe(monkeypatch) -> None:
    """env/cuda.json and `accelbench doctor` read the same GpuProbe: NVML starts once."""
    from accelbench.system import doctor

    probe = hardware.GpuProbe(
        torch_cuda="13.0",
        driver="580.1",
        driver_cuda="13.0",
        nvml_gpus=("NVIDIA H200",) * 2,
        cuda_available=True,
        torch_gpus=("NVIDIA H200",) * 2,
        capability=(9, 0),
        memory_gib=139.8,
        cudnn=91900,
        bf16=True,
    )
    facts = hardware.cuda_facts(probe)
    assert facts.gpu.gpu_count == 2 and facts.gpu.compute_capability == "9.0"
    assert facts.nvidia_driver == "580.1" and facts.gpu.gpu_memory_gib == 139.8
    software = hardware.software_facts()
    assert facts.to_json() == {  # env/cuda.json, flat, as ever
        "torch_cuda_runtime": "13.0", "nvidia_driver": "580.1", "python": software.python,
        "torch": software.torch, "torchvision": software.torchvision, "cuda_available": True,
        "gpu_count": 2, "gpu_names": ["NVIDIA H200"] * 2, "compute_capability": "9.0",
        "gpu_memory_gib": 139.8, "cudnn": 91900, "bf16_supported": True,
    }  # fmt: skip
    monkeypatch.setattr(hardware, "_nvml", lambda: pytest.fail("the probe was asked again"))
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_90"])
    monkeypatch.setattr(torch, "arange", lambda *a, **k: pytest.fail("no kernel without a GPU"))
    cpu_only = hardware.GpuProbe("13.0", None, None, (), cuda_available=False)
    without = hardware.cuda_facts(cpu_only)
    assert without.gpu is None and without.reason.startswith("no NVIDIA driver found")
    assert set(without.to_json()) == {
        "torch_cuda_runtime", "nvidia_driver", "python", "torch", "torchvision",
        "cuda_available", "reason",
    }  # fmt: skip
    assert doctor.gather(cpu_only).driver is None


def _zone(root, name: str, energy_uj: int, max_uj: int = 1000) -> None:
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_reader_sums_packages_skips_subzones_and_undoes_wraparound(tmp_path) -> None:
    assert hardware.cpu_energy_reader(tmp_path) is None  # no RAPL: no reading, not zeros
    _zone(tmp_path, "intel-rapl:0", 900)
    _zone(tmp_path, "intel-rapl:1", 100)
    _zone(tmp_path, "intel-rapl:0:0", 0)  # a subzone (core): inside package 0 already
    read = hardware.cpu_energy_reader(tmp_path)
    _zone(tmp_path, "intel-rapl:0", 50)  # wrapped at 1000 µJ: 151 µJ used
    _zone(tmp_path, "intel-rapl:1", 300)  # 200 µJ
    _zone(tmp_path, "intel-rapl:0:0", 999)
    assert read() == (151 + 200) / 1e6
    _zone(tmp_path, "intel-rapl:1", 400)
    assert read() == (151 + 300) / 1e6


def test_rapl_reader_is_none_where_the_counter_cannot_be_read(tmp_path, monkeypatch) -> None:
    """Since Linux 5.10 energy_uj is root-only: reading it fails with EACCES."""
    from pathlib import Path

    _zone(tmp_path, "intel-rapl:0", 5)
    read_text = Path.read_text

    def root_only(path, *args, **kwargs):
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", root_only)
    assert hardware.cpu_energy_reader(tmp_path) is None
