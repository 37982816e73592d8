"""Facts about the machine that decide whether two results are comparable.

Only stable facts (no timestamps, no utilization): the env stage re-runs on every
`dvc repro`, and its outputs change only when the hardware or the software stack does, so
only then do the training stages downstream of them re-run.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def software_facts() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
    }


def cpu_facts() -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_default_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        **software_facts(),
    }


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver's version through NVML, or None where there is no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    finally:
        pynvml.nvmlShutdown()


def cuda_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "torch_cuda_runtime": torch.version.cuda,
        "nvidia_driver": nvidia_driver_version(),
        **software_facts(),
    }
    if not torch.cuda.is_available():
        facts["cuda_available"] = False
        facts["reason"] = cuda_unavailable_reason(facts)
        return facts
    count = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    capability = torch.cuda.get_device_capability(0)
    facts.update(
        cuda_available=True,
        gpu_count=count,
        gpu_names=names,
        compute_capability=f"{capability[0]}.{capability[1]}",
        gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        cudnn=torch.backends.cudnn.version(),
        bf16_supported=torch.cuda.is_bf16_supported(),
    )
    return facts


def cuda_unavailable_reason(facts: dict[str, Any] | None = None) -> str:
    facts = facts if facts is not None else {}
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if facts.get("nvidia_driver") is None and nvidia_driver_version() is None:
        return "no NVIDIA driver found (NVML could not start): no GPU on this machine"
    return "torch.cuda.is_available() is False (driver too old for this torch build?)"


# Dense peak rates (TFLOP/s) from the vendors' datasheets, SXM parts; leads, not measurements.
# fp32 = plain FP32 units; tf32 = the matrix units' float32 mode; half = bf16/fp16 matrix units.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"fp32": 66.9, "tf32": 494.7, "half": 989.4},
    "H100": {"fp32": 66.9, "tf32": 494.7, "half": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "half": 312.0},
}


def peak_tflops(device_name: str, precision: str, tf32: bool) -> float | None:
    """The datasheet peak for the arithmetic this variant uses, or None if unknown."""
    mode = "half" if precision in ("fp16", "bf16") else ("tf32" if tf32 else "fp32")
    for model, rates in PEAK_TFLOPS.items():
        if model in device_name:
            return rates[mode]
    return None


def gpu_energy_reader(device: int = 0):
    """A function returning CUDA device `device`'s energy counter in joules (NVML), or None.

    NVML counts millijoules since the driver loaded (Volta and newer); differences between two
    readings are the energy the board used in between. NVML numbers GPUs as the driver does,
    torch as CUDA_VISIBLE_DEVICES lists them: the board is found by its UUID, and where that
    fails the index is trusted only when no CUDA_VISIBLE_DEVICES reorders the devices (no
    reading rather than another GPU's).
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = _nvml_handle(pynvml, device)
        if handle is None:
            return None
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:  # no NVML, no driver, or no energy counter on this GPU
        return None
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


def _nvml_handle(pynvml, device: int):
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        prefix = "" if uuid.startswith(("GPU-", "MIG-")) else "GPU-"
        return pynvml.nvmlDeviceGetHandleByUUID(prefix + uuid)
    except Exception:
        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            return None
        return pynvml.nvmlDeviceGetHandleByIndex(device)
