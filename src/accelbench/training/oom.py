"""CUDA out of memory: retry with smaller passes (same batch), or say what to change."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from accelbench.core.console import StageError, log
from accelbench.training.placement import Placement

T = TypeVar("T")


def retry_on_oom(
    attempt: Callable[[int, bool], T],
    *,
    name: str,
    batch_size: int,
    accumulation_steps: int,
    retries: int,
    placement: Placement,
) -> tuple[T, int]:
    """`attempt(accumulation_steps, fresh)`, retried from scratch (`fresh` true) up to
    `retries` times after an OOM, each time with twice the passes per step: half the samples
    per pass, the same batch. Returns its result and the accumulation it succeeded with."""
    accumulation, fresh = accumulation_steps, False
    for tried in range(retries + 1):
        try:
            return attempt(accumulation, fresh), accumulation
        except torch.cuda.OutOfMemoryError as exc:
            per_pass = batch_size // placement.world_size // accumulation
            if tried == retries or per_pass < 2:
                raise StageError(oom_message(name, batch_size, accumulation, placement)) from exc
            accumulation *= 2
            log(
                f"train {name}: CUDA out of memory at {per_pass} samples per pass; "
                f"retrying from scratch with accumulation_steps {accumulation} "
                f"({per_pass // 2} per pass, same batch {batch_size})"
            )
            fresh = True
            if placement.device is not None and placement.device.type == "cuda":
                torch.cuda.empty_cache()
    raise AssertionError("unreachable: the last attempt returns or raises")


def oom_message(name: str, batch_size: int, accumulation: int, placement: Placement) -> str:
    device = placement.device
    total = (
        f"{torch.cuda.get_device_properties(device).total_memory / 2**30:.1f} GiB"
        if device is not None and device.type == "cuda"
        else "n/a"
    )
    return (
        f"variant {name!r}: CUDA out of memory with batch {batch_size} "
        f"({batch_size // accumulation} samples per forward/backward pass) on "
        f"{placement.device_name} ({total}). Lower train.batch_size, or raise "
        "train.accumulation_steps (same effective batch, less memory), or set "
        "train.oom_retries: N to let the stage halve the per-pass batch itself."
    )
