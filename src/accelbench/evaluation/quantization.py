"""Post-training int8 quantization for CPU inference, and what it costs or gains.

Dynamic int8 (tutorial A's last section) stores the Linear layers' weights as int8 and
quantizes activations on the fly. The CNNs' cost is in their convolutions, which it leaves in
fp32, so static int8 is measured beside it: FX graph mode with the x86 backend's default
qconfig (Conv+ReLU fused, activations calibrated on training images). Both are
`torch.ao.quantization`, deprecated in torch 2.14 (succeeded by torchao's PT2E export
quantization); a build without them, or without the x86 engine, gets a stated reason instead
of a figure. Everything here is pure: models in, numbers out.
"""

from __future__ import annotations

import copy
import io
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from accelbench.core.results import InferenceFigures

STATIC_ENGINE = "x86"


@contextmanager
def _quiet_deprecation() -> Iterator[None]:
    """torch.ao.quantization warns on every call that it is deprecated: once is in docs/pipeline.md."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quant_min and quant_max.*")
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        yield


def dynamic_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` with its Linear layers dynamically quantized to int8."""
    from torch.ao.quantization import quantize_dynamic

    with _quiet_deprecation():
        return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)


def static_int8_unsupported(engines: list[str] | None = None) -> str | None:
    """Why this torch build cannot run static int8 with the x86 backend (None: it can);
    `engines`: the build's quantized engines (default: asked from torch)."""
    if engines is None:
        engines = list(torch.backends.quantized.supported_engines)
    if STATIC_ENGINE not in engines:
        listed = ", ".join(engines) or "none"
        return f"this torch build has no {STATIC_ENGINE!r} quantized engine (it has: {listed})"
    try:
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no FX graph mode quantization ({exc})"
    return None


def static_int8(model: nn.Module, calibration: list[torch.Tensor]) -> nn.Module:
    """A copy of `model` statically quantized to int8 (x86 backend): weights per channel,
    activations per tensor with ranges observed on the `calibration` batches."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = STATIC_ENGINE
    with _quiet_deprecation(), torch.no_grad():
        prepared = prepare_fx(
            copy.deepcopy(model).eval(),
            get_default_qconfig_mapping(STATIC_ENGINE),
            (calibration[0][:1],),
        )
        for images in calibration:
            prepared(images)
        return convert_fx(prepared)


def size_bytes(model: nn.Module) -> int:
    """The size of the model's state_dict as torch.save writes it (what a deployment ships)."""
    buffer = io.BytesIO()
    with _quiet_deprecation():
        torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes


@torch.no_grad()
def measure(
    models: Mapping[str, nn.Module],
    batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]],
    single: torch.Tensor,
    latency_repeats: int,
) -> dict[str, InferenceFigures]:
    """Each model's accuracy and throughput over one pass of `batches()`, and its median
    latency over `latency_repeats` forward passes of the one-image batch `single`. The latency
    passes take turns (A, B, C, A, B, C, ...): a busy spell of a shared machine slows all alike.
    """
    passes: dict[str, tuple[float, float]] = {}
    with _quiet_deprecation():
        for method, model in models.items():
            model.eval()
            model(single)  # warm-up: one-time packing of weights, allocator
            correct = samples = 0
            started = time.perf_counter()
            for images, labels in batches():
                correct += int((model(images).argmax(dim=1) == labels).sum())
                samples += len(labels)
            passes[method] = (correct / samples, samples / (time.perf_counter() - started))
        latencies: dict[str, list[float]] = {method: [] for method in models}
        for _ in range(latency_repeats):
            for method, model in models.items():
                tick = time.perf_counter()
                model(single)
                latencies[method].append(time.perf_counter() - tick)
    return {
        method: InferenceFigures(
            method=method,
            test_accuracy=passes[method][0],
            latency_ms=1000 * statistics.median(latencies[method]),
            samples_per_s=passes[method][1],
            size_bytes=size_bytes(model),
        )
        for method, model in models.items()
    }
