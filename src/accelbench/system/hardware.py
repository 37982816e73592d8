"""Facts about the machine that decide whether two results are comparable.

Only stable facts (no timestamps, no utilization): the env stage re-runs on every
`dvc repro`, and its outputs change only when the hardware or the software stack does, so
only then do the training stages downstream of them re-run.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from accelbench.core.env_facts import CpuFacts, CudaFacts, GpuFacts, SoftwareFacts


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def software_facts() -> SoftwareFacts:
    import torch

    try:
        torchvision = metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        torchvision = None
    return SoftwareFacts(
        python=platform.python_version(), torch=torch.__version__, torchvision=torchvision
    )


def cpu_facts() -> CpuFacts:
    """env/cpu.json: the CPU and the software stack."""
    import torch

    return CpuFacts(
        cpu_model=cpu_model(),
        logical_cpus=os.cpu_count(),
        torch_default_threads=torch.get_num_threads(),
        machine=platform.machine(),
        software=software_facts(),
    )


NO_DRIVER = "no NVIDIA driver found (NVML could not start): no GPU on this machine"


@dataclass(frozen=True)
class GpuProbe:
    """What NVML (the driver) and torch say about this machine's GPUs, asked once."""

    torch_cuda: str | None  # the CUDA runtime torch was built with ("13.0"); None: CPU build
    driver: str | None  # NVIDIA driver version (NVML); None without a driver
    driver_cuda: str | None  # newest CUDA the driver supports ("13.0")
    nvml_gpus: tuple[str, ...] = ()  # GPUs the driver sees
    cuda_available: bool = False
    torch_gpus: tuple[str, ...] = ()  # GPUs torch can use (CUDA_VISIBLE_DEVICES applies)
    capability: tuple[int, int] | None = None  # of GPU 0
    memory_gib: float | None = None  # of GPU 0
    cudnn: int | None = None
    bf16: bool | None = None

    @property
    def unavailable_reason(self) -> str:
        import torch

        if self.torch_cuda is None:
            return f"torch {torch.__version__} is a CPU-only build"
        if self.driver is None:
            return NO_DRIVER
        return "torch.cuda.is_available() is False (driver too old for this torch build?)"


def _nvml() -> dict[str, Any]:
    """Driver version, its newest CUDA and the GPUs it sees; {} where NVML cannot start."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        decode = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()  # e.g. 13000
        count = pynvml.nvmlDeviceGetCount()
        return {
            "driver": decode(pynvml.nvmlSystemGetDriverVersion()),
            "driver_cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "nvml_gpus": tuple(
                decode(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(count)
            ),
        }
    finally:
        pynvml.nvmlShutdown()


def nvml_gpu_count() -> tuple[int, str] | None:
    """The GPUs the driver sees and, for none, why, asked of NVML alone (no torch import, a
    few milliseconds); None where NVML cannot tell. No process sees more GPUs than the
    driver, so a count below what a variant needs settles that it cannot run here."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:  # no libnvidia-ml: no NVIDIA driver at all
        return 0, NO_DRIVER
    except pynvml.NVMLError:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
    return count, "" if count else "the NVIDIA driver sees no GPU"


def probe_gpus() -> GpuProbe:
    """Ask NVML and torch about the GPUs; never fails on a machine without one."""
    import torch

    nvml = _nvml()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    probe = GpuProbe(
        torch_cuda=torch.version.cuda,
        driver=nvml.get("driver"),
        driver_cuda=nvml.get("driver_cuda"),
        nvml_gpus=nvml.get("nvml_gpus", ()),
        cuda_available=torch.cuda.is_available(),
        cudnn=cudnn,
    )
    if not probe.cuda_available:
        return probe
    return replace(
        probe,
        torch_gpus=tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())),
        capability=torch.cuda.get_device_capability(0),
        memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        bf16=torch.cuda.is_bf16_supported(),
    )


def cuda_facts(probe: GpuProbe) -> CudaFacts:
    """env/cuda.json: the probe's stable facts."""
    gpu = None
    if probe.cuda_available:
        major, minor = probe.capability or (0, 0)
        gpu = GpuFacts(
            gpu_count=len(probe.torch_gpus),
            gpu_names=list(probe.torch_gpus),
            compute_capability=f"{major}.{minor}",
            gpu_memory_gib=probe.memory_gib,
            cudnn=probe.cudnn,
            bf16_supported=probe.bf16,
        )
    return CudaFacts(
        torch_cuda_runtime=probe.torch_cuda,
        nvidia_driver=probe.driver,
        software=software_facts(),
        gpu=gpu,
        reason=None if gpu else probe.unavailable_reason,
    )


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
    NVML numbers GPUs as the driver does, torch as CUDA_VISIBLE_DEVICES lists them: the board
    is found by its UUID, else by index only where no CUDA_VISIBLE_DEVICES reorders them."""
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            prefix = "" if uuid.startswith(("GPU-", "MIG-")) else "GPU-"
            handle = pynvml.nvmlDeviceGetHandleByUUID(prefix + uuid)
        except Exception:  # torch without the UUID, or NVML without that board: many types
            if os.environ.get("CUDA_VISIBLE_DEVICES"):
                return None
            handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:  # no NVML, no driver, or no energy counter on this GPU
        return None
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


RAPL_ROOT = Path("/sys/class/powercap")


def cpu_energy_reader(root: Path = RAPL_ROOT) -> Callable[[], float] | None:
    """A function returning the CPU packages' energy in joules since it was made (RAPL), or
    None where no package counter is readable (no RAPL, a VM, or root-only `energy_uj`, the
    kernel's default since 5.10). Sums the top-level zones, one per package (AMD's too),
    undoing each counter's wrap between readings (at least every few minutes: an epoch)."""
    zones = []
    # intel-rapl:0:0 is a subzone (core, uncore, dram)
    for zone in (z for z in sorted(root.glob("intel-rapl:*")) if z.name.count(":") == 1):
        try:
            wrap = int((zone / "max_energy_range_uj").read_text()) + 1
            first = int((zone / "energy_uj").read_text())
        except (OSError, ValueError):
            continue
        zones.append([zone / "energy_uj", wrap, first, 0])  # path, wrap, last raw, total µJ
    if not zones:
        return None

    def joules() -> float:
        for state in zones:
            path, wrap, last, total = state
            raw = int(path.read_text())
            state[2:] = raw, total + (raw - last) % wrap
        return sum(state[3] for state in zones) / 1e6

    return joules
