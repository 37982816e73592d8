"""`accelbench doctor`: does this machine's NVIDIA driver, GPU and torch build fit together?

`gather()` takes the facts (the env stage shares its probe) and runs a small kernel;
`diagnose()` is pure and decides, so tests feed it every case a CPU-only machine cannot show.

Exit codes: 0 the GPU is ready; 3 CPU only (no NVIDIA driver, or no GPU) and nothing asked
for a GPU; 1 something is wrong (each problem is printed with what to do).
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from accelbench.system.hardware import GpuProbe, probe_gpus

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_CPU_ONLY = 3


@dataclass(frozen=True)
class Facts(GpuProbe):
    """The probe's facts, and what the doctor finds out itself."""

    torch_version: str = ""
    arch_list: tuple[str, ...] = ()  # e.g. ("sm_75", "sm_80", "sm_90", "compute_90")
    kernel_ok: bool | None = None  # a small kernel ran and gave the right answer
    kernel_error: str | None = None
    torch_bytecode: bool | None = None  # torch's .pyc: without it each stage compiles torch
    torch_folder: str | None = None


@dataclass
class Report:
    rows: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cpu_only: bool = False

    @property
    def exit_code(self) -> int:
        if self.problems:
            return EXIT_PROBLEM
        return EXIT_CPU_ONLY if self.cpu_only else EXIT_OK


def _version_tuple(version: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in (version or "").split(".")[:2] if p.isdigit())


def _arch_supported(capability: tuple[int, int], arch_list: tuple[str, ...]) -> bool:
    major, minor = capability
    code = major * 10 + minor
    if f"sm_{code}" in arch_list:
        return True
    # PTX for an older architecture of the same major version is JIT-compiled by the driver.
    ptx = [int(a.split("_")[1].rstrip("a")) for a in arch_list if a.startswith("compute_")]
    return any(p // 10 == major and p <= code for p in ptx)


def diagnose(facts: Facts, *, require_gpu: bool = False) -> Report:
    report = Report(rows=_rows(facts))
    if facts.driver is None and not facts.nvml_gpus:
        report.cpu_only = True
        report.rows.append(
            ("verdict", "CPU only: no NVIDIA driver found; CUDA variants will be skipped")
        )
        if require_gpu:
            report.problems.append(
                "a GPU is required (train.require_gpu or --require-gpu) but no NVIDIA driver was "
                "found: run on a GPU machine, and in a container start it with the GPU visible "
                "(`docker run --gpus all`, or the devcontainer on a host with a GPU)"
            )
        return report
    report.problems = _gpu_problems(facts, require_gpu)
    report.rows.append(("verdict", "problems found" if report.problems else "GPU ready"))
    return report


def _rows(facts: Facts) -> list[tuple[str, str]]:
    """The facts as the report's (name, value) rows, those not known left out."""
    rows = [
        ("torch", facts.torch_version),
        ("torch CUDA runtime", facts.torch_cuda or "none (CPU-only build)"),
        ("cuDNN", str(facts.cudnn) if facts.cudnn else "n/a"),
        ("NVIDIA driver", facts.driver or "not found"),
        ("driver supports CUDA up to", facts.driver_cuda or "n/a"),
        ("GPUs (driver)", ", ".join(facts.nvml_gpus) or "none"),
        ("GPUs (torch)", ", ".join(facts.torch_gpus) or "none"),
    ]
    if facts.capability:
        rows.append(("compute capability", f"{facts.capability[0]}.{facts.capability[1]}"))
    rows.append(("torch build architectures", " ".join(facts.arch_list) or "n/a"))
    if facts.bf16 is not None:
        rows.append(("bf16 supported", "yes" if facts.bf16 else "no"))
    if facts.kernel_ok is not None:
        kernel = "passed" if facts.kernel_ok else f"FAILED: {facts.kernel_error}"
        rows.append(("CUDA kernel test", kernel))
    if facts.torch_bytecode is False:
        none = "none: every process compiles torch from source, seconds of each stage "
        none += "(PYTHONDONTWRITEBYTECODE, or a read-only install); compile it once: "
        rows.append(("torch bytecode", f"{none}python -m compileall -q -j 0 {facts.torch_folder}"))
    return rows


def _gpu_problems(facts: Facts, require_gpu: bool) -> list[str]:
    """What stops torch from using the GPUs that the NVIDIA driver sees, with what to do."""
    problems = []
    if facts.torch_cuda is None:
        problems.append(
            f"the NVIDIA driver {facts.driver} sees {len(facts.nvml_gpus)} GPU(s), but torch "
            f"{facts.torch_version} is a CPU-only build: install a CUDA build of torch (`make "
            "setup` installs the lock's CUDA 13.0 build; see the docs/containers.md for other "
            "CUDA flavours)"
        )
    elif facts.driver_cuda and _version_tuple(facts.driver_cuda) < _version_tuple(facts.torch_cuda):
        problems.append(
            f"the NVIDIA driver {facts.driver} supports CUDA up to {facts.driver_cuda}, but torch "
            f"was built for CUDA {facts.torch_cuda}: upgrade the driver (CUDA 13.0 needs >= 580, "
            "12.8 needs >= 570, 12.6 needs >= 560), or use a torch build for an older CUDA "
            "(build the image with --build-arg TORCH_CUDA=cu126 and the matching CUDA_VERSION)"
        )
    if facts.torch_cuda is not None and not facts.cuda_available and not problems:
        problems.append(
            "torch cannot use the GPU (torch.cuda.is_available() is False) although the driver "
            f"{facts.driver} is there: in a container, start it with `--gpus all`; on a host, "
            "check `nvidia-smi` and CUDA_VISIBLE_DEVICES"
        )
    if (
        facts.capability
        and facts.arch_list
        and not _arch_supported(facts.capability, facts.arch_list)
    ):
        problems.append(
            f"the GPU's compute capability {facts.capability[0]}.{facts.capability[1]} is not in "
            f"this torch build's architectures ({' '.join(facts.arch_list)}): install a torch "
            "build that supports it"
        )
    if facts.kernel_ok is False:
        problems.append(f"a small CUDA kernel failed: {facts.kernel_error}")
    if require_gpu and not facts.torch_gpus and not problems:
        problems.append("a GPU is required but torch sees none")
    return problems


def gather(probe: GpuProbe | None = None) -> Facts:
    """The probe's facts (asked now unless given), torch's build architectures and whether a
    small kernel runs on the GPU."""
    import torch

    probe = probe if probe is not None else probe_gpus()
    facts = Facts(
        **asdict(probe),
        torch_version=torch.__version__,
        arch_list=tuple(torch.cuda.get_arch_list()) if probe.torch_cuda else (),
        torch_bytecode=Path(importlib.util.cache_from_source(torch.__file__)).exists(),
        torch_folder=str(Path(torch.__file__).parent),
    )
    if not probe.cuda_available:
        return facts
    try:
        x = torch.arange(1024, device="cuda", dtype=torch.float32)
        kernel_ok = float((x * 2).sum().item()) == float(1023 * 1024)
        kernel_error = None if kernel_ok else "wrong result from a sum on the GPU"
    except RuntimeError as exc:
        kernel_ok, kernel_error = False, str(exc).splitlines()[0]
    return replace(facts, kernel_ok=kernel_ok, kernel_error=kernel_error)


def render(report: Report) -> str:
    width = max(len(k) for k, _ in report.rows)
    lines = [f"{key.ljust(width)}  {value}" for key, value in report.rows]
    return "\n".join(lines + [f"PROBLEM: {problem}" for problem in report.problems])
