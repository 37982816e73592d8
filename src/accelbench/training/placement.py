"""Where a variant runs: the device, this process's rank and the world size, or why not here.

One rule for env (refusing early under `train.require_gpu`), train (the launcher and each
torchrun child) and evaluate: a CPU variant runs on the CPU; a CUDA variant needs one GPU, a
DDP variant `distributed.nproc_per_node`; lacking them, it is skipped (recorded as such), or
refused under `train.require_gpu` (evaluating a CUDA-trained model is always refused). A DDP
variant is re-launched under torchrun, and each child (torchrun sets LOCAL_RANK, RANK and
WORLD_SIZE) binds itself to GPU LOCAL_RANK.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelbench.core.console import StageError
from accelbench.core.params import VariantParams
from accelbench.system import hardware

if TYPE_CHECKING:
    import torch

REFUSAL_ADVICE = (
    "Run on a machine with the GPUs needed (or lower distributed.nproc_per_node), or set "
    "train.require_gpu: false in params.yaml to record such variants as skipped."
)


@dataclass(frozen=True)
class Visible:
    """The GPUs torch can use in this process, and why there are none, if none."""

    gpus: int
    why_none: str = ""

    @classmethod
    def of(cls, probe: hardware.GpuProbe) -> Visible:
        if probe.cuda_available:
            return cls(len(probe.torch_gpus))
        return cls(0, probe.unavailable_reason)


def visible(at_least: int = 1) -> Visible:
    """The GPUs this process can use: NVML's answer where it settles the question
    (`nvml_visible`), else torch's."""
    return nvml_visible(at_least) or torch_visible()


def nvml_visible(at_least: int) -> Visible | None:
    """The GPUs here, where NVML alone shows fewer than `at_least`: that settles it without
    importing torch (seconds on some hosts), so a variant this machine cannot run is skipped
    at once. None: torch must be asked."""
    nvml = hardware.nvml_gpu_count()
    if nvml is not None and nvml[0] < at_least:
        return Visible(*nvml)
    return None


def torch_visible() -> Visible:
    """The GPUs torch can use in this process (imports torch)."""
    import torch

    if torch.cuda.is_available():
        return Visible(torch.cuda.device_count())
    return Visible.of(hardware.probe_gpus())


def gpus_needed(variant: VariantParams) -> int:
    """GPUs `variant` needs on this machine: none, one, or one per process of the node."""
    if not variant.uses_cuda:
        return 0
    return variant.distributed.nproc_per_node if variant.distributed else 1


# What a variant lacks, as a verb and its object, so that several variants can share it.
_PLURAL = {"needs": "need", "asks": "ask"}


def _lack(variant: VariantParams, here: Visible, why: bool = True) -> tuple[str, str] | None:
    """`shortfall` as (verb, the rest), the verb in the singular (a key of _PLURAL); `why`:
    with the machine's reason for having no GPU, where it has one."""
    needed = gpus_needed(variant)
    if here.gpus >= needed:
        return None
    reason = here.why_none if why else ""
    if variant.distributed is None:
        return "needs", f"CUDA but {reason}" if reason else "CUDA"
    return "asks", (
        f"for {needed} GPUs per node (distributed.nproc_per_node) but "
        f"this machine has {here.gpus}" + (f" ({reason})" if reason else "")
    )


def shortfall(variant: VariantParams, here: Visible) -> str | None:
    """What `variant` lacks on this machine ("needs CUDA but ..."), or None if it can run."""
    lack = _lack(variant, here)
    return None if lack is None else " ".join(lack)


@dataclass(frozen=True)
class Placement:
    """Where this process trains a variant. Exactly one of: `skip_reason` set (nothing to
    run here), `launch` (re-run under torchrun), or a device to train on."""

    device: torch.device | None = None
    device_name: str = ""
    rank: int = 0
    world_size: int = 1
    backend: str | None = None  # a torchrun child: the process group to join
    launch: bool = False  # the launching process of a DDP variant
    skip_reason: str | None = None  # what the variant lacks here (the report groups by it)

    @property
    def main(self) -> bool:
        """The process that writes outputs and tracks the run."""
        return self.rank == 0


def place(
    name: str,
    variant: VariantParams,
    *,
    require_gpu: bool,
    environ: Mapping[str, str] = os.environ,
    here: Visible | None = None,
) -> Placement:
    """Where `variant` trains in this process (`here`: the GPUs visible, where known);
    raises StageError where it must be refused."""
    if torchrun_child(variant, environ):
        return _torchrun_child(variant, environ)  # the launcher checked the machine
    needed = gpus_needed(variant)
    # NVML alone settles too few GPUs: a skipped variant never imports torch
    if needed and (missing := shortfall(variant, here or visible(needed))) is not None:
        if require_gpu:
            raise StageError(f"variant {name!r} {missing}. {REFUSAL_ADVICE}")
        return Placement(skip_reason=missing)
    import torch

    if variant.distributed is not None:
        return Placement(launch=True, world_size=variant.distributed.world_size)
    if variant.uses_cuda:
        return Placement(torch.device("cuda"), torch.cuda.get_device_name(0))
    return Placement(torch.device("cpu"), hardware.cpu_model())


def torchrun_child(variant: VariantParams, environ: Mapping[str, str] = os.environ) -> bool:
    """This process is one of a DDP variant's torchrun workers (torchrun set LOCAL_RANK)."""
    return variant.distributed is not None and "LOCAL_RANK" in environ


def _torchrun_child(variant: VariantParams, environ: Mapping[str, str]) -> Placement:
    import torch

    local_rank = int(environ["LOCAL_RANK"])
    backend = variant.distributed.backend
    if backend == "auto":
        backend = "nccl" if variant.uses_cuda else "gloo"
    if variant.uses_cuda:
        torch.cuda.set_device(local_rank)  # before anything else touches the GPU
        device = torch.device("cuda", local_rank)
        device_name = torch.cuda.get_device_name(local_rank)
    else:
        device, device_name = torch.device("cpu"), hardware.cpu_model()
    return Placement(
        device,
        device_name,
        rank=int(environ["RANK"]),
        world_size=int(environ["WORLD_SIZE"]),
        backend=backend,
    )


def evaluation_device(
    name: str, variant: VariantParams, here: Visible | None = None
) -> torch.device:
    """The device a trained model is evaluated on: the one it trained on, in one process."""
    import torch

    single = variant.model_copy(update={"distributed": None})
    if (missing := shortfall(single, here or visible())) is not None:
        raise StageError(
            f"evaluate: variant {name!r} {missing}: the model was trained on CUDA; evaluate it where CUDA is "
            "available"
        )
    return torch.device("cuda") if variant.uses_cuda else torch.device("cpu")


def refusals(variants: Mapping[str, VariantParams], here: Visible | None = None) -> list[str]:
    """The variants this machine cannot run, those lacking the same thing in one phrase
    ("variants 'gpu', 'amp' need CUDA"), for train.require_gpu's refusal, which gives the
    machine's reason (`Visible.why_none`) once, not once per variant."""
    here = here or visible()
    lacking: dict[tuple[str, str], list[str]] = {}
    for name, variant in variants.items():
        if (lack := _lack(variant, here, why=False)) is not None:
            lacking.setdefault(lack, []).append(repr(name))
    return [
        f"variant {names[0]} {verb} {rest}"
        if len(names) == 1
        else f"variants {', '.join(names)} {_PLURAL[verb]} {rest}"
        for (verb, rest), names in lacking.items()
    ]
