"""`env/<device>.json`: the machine's stable facts (env writes them, compare reads them)."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from pydantic import model_validator
from pydantic.dataclasses import dataclass as record

from accelbench.core.console import echo
from accelbench.core.outputs import env_json
from accelbench.core.results import RECORD, Bool, Float, Int, Record, Str, read


@record(frozen=True, config=RECORD)
class SoftwareFacts(Record):
    """The software stack, in both env files."""

    python: Str
    torch: Str
    torchvision: Str | None  # None: not installed


def _nest(payload: dict[str, Any], name: str, cls: type) -> dict[str, Any]:
    """A flat file's keys, with those of the record `cls` under `name`."""
    own = {f.name for f in fields(cls)}
    return {k: v for k, v in payload.items() if k not in own} | {
        name: {k: v for k, v in payload.items() if k in own}
    }


@record(frozen=True, config=RECORD)
class CpuFacts(Record):
    """`env/cpu.json`: the CPU and the software stack (flat in the file)."""

    cpu_model: Str
    logical_cpus: Int | None  # os.cpu_count(); None where it cannot tell
    torch_default_threads: Int
    machine: Str  # platform.machine(): x86_64, aarch64
    software: SoftwareFacts

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any) -> Any:
        return _nest(data, "software", SoftwareFacts) if isinstance(data, dict) else data

    def to_json(self) -> dict[str, Any]:
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "software"}
        return own | asdict(self.software)


@record(frozen=True, config=RECORD)
class GpuFacts(Record):
    """The GPUs torch can use, as `env/cuda.json` records them (capability, memory: GPU 0's)."""

    gpu_count: Int
    gpu_names: list[Str]
    compute_capability: Str  # "9.0"
    gpu_memory_gib: Float
    cudnn: Int | None
    bf16_supported: Bool


@record(frozen=True, config=RECORD)
class CudaFacts(Record):
    """`env/cuda.json` (flat, `cuda_available` saying which): torch's CUDA build, the driver,
    the software stack, and the GPUs torch can use (`gpu`) or why none (`reason`)."""

    torch_cuda_runtime: Str | None  # None: a CPU-only torch build
    nvidia_driver: Str | None  # None: no driver found
    software: SoftwareFacts
    gpu: GpuFacts | None = None
    reason: Str | None = None  # where `gpu` is None

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any) -> Any:
        if not isinstance(data, dict):  # built in code
            return data
        available = data.get("cuda_available")
        if not isinstance(available, bool):
            raise ValueError(f"cuda_available = {echo(available)}: expected true or false")
        if not available and (facts := [f.name for f in fields(GpuFacts) if f.name in data]):
            raise ValueError(f"cuda_available is false, yet GPU facts are there: {facts}")
        data = _nest({k: v for k, v in data.items() if k != "cuda_available"}, "software",
                     SoftwareFacts)  # fmt: skip
        return _nest(data, "gpu", GpuFacts) if available else data

    @model_validator(mode="after")
    def _gpu_or_reason(self) -> CudaFacts:
        if (self.gpu is None) == (self.reason is None):
            raise ValueError("expected either usable GPUs (cuda_available true) or the reason "
                             "there are none, not both")  # fmt: skip
        return self

    @property
    def cuda_available(self) -> bool:
        return self.gpu is not None

    def to_json(self) -> dict[str, Any]:
        facts = {
            "torch_cuda_runtime": self.torch_cuda_runtime,
            "nvidia_driver": self.nvidia_driver,
            **asdict(self.software),
            "cuda_available": self.cuda_available,
        }
        return facts | (asdict(self.gpu) if self.gpu else {"reason": self.reason})


@record(frozen=True, config=RECORD)
class EnvFacts:
    """The machine the variants ran on: `env/<device>.json` for each of ENV_DEVICES."""

    cpu: CpuFacts
    cuda: CudaFacts

    def files(self) -> dict[str, dict[str, Any]]:
        """Each file's JSON, by its device."""
        return {"cpu": self.cpu.to_json(), "cuda": self.cuda.to_json()}


def read_env(folder: Path) -> EnvFacts:
    """`env/`'s files, as the env stage wrote them."""
    return EnvFacts(
        read(CpuFacts, env_json(folder, "cpu")), read(CudaFacts, env_json(folder, "cuda"))
    )
