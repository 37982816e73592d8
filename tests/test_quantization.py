"""quantization.py: int8 models that still classify, are smaller, and figures that add up."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accelbench.evaluation import quantization
from accelbench.training.models import SeedCNN


def _model() -> SeedCNN:
    torch.manual_seed(0)
    return SeedCNN().eval()


def test_dynamic_int8_quantizes_the_linear_layer_only_and_keeps_the_outputs() -> None:
    model = _model()
    quantized = quantization.dynamic_int8(model)
    assert ".quantized.dynamic." in type(quantized.classifier).__module__
    assert isinstance(quantized.features[2], nn.Conv2d)  # convolutions stay fp32
    assert isinstance(model.classifier, nn.Linear)  # the original is untouched
    x = torch.randn(8, 1, 28, 28)
    assert torch.allclose(quantized(x), model(x), atol=0.05)
    assert quantization.size_bytes(quantized) < quantization.size_bytes(model) / 2


@pytest.mark.skipif(
    quantization.static_int8_unsupported() is not None, reason="no x86 static int8 here"
)
def test_static_int8_quantizes_the_convolutions_too() -> None:
    model = _model()
    calibration = [torch.randn(64, 1, 28, 28) for _ in range(2)]
    quantized = quantization.static_int8(model, calibration)
    x = calibration[0][:16]
    assert torch.allclose(quantized(x), model(x), atol=0.2)
    assert (quantized(x).argmax(1) == model(x).argmax(1)).float().mean() >= 0.75
    assert quantization.size_bytes(quantized) < quantization.size_bytes(model) / 3


def test_static_int8_unsupported_names_the_missing_engine() -> None:
    assert quantization.static_int8_unsupported(["qnnpack"]) == (
        "this torch build has no 'x86' quantized engine (it has: qnnpack)"
    )


def test_measure_counts_accuracy_over_every_batch_for_each_model() -> None:
    model = _model()
    images = torch.randn(10, 1, 28, 28)
    labels = model(images).argmax(1)
    labels[:3] = (labels[:3] + 1) % 10  # three wrong on purpose
    dynamic = quantization.dynamic_int8(model)
    figures = quantization.measure(
        {"fp32": model, "dynamic_int8": dynamic},
        lambda: iter([(images[:6], labels[:6]), (images[6:], labels[6:])]),
        images[:1], latency_repeats=5,
    )  # fmt: skip
    assert list(figures) == ["fp32", "dynamic_int8"]
    assert figures["fp32"].test_accuracy == pytest.approx(0.7)
    assert figures["fp32"].latency_ms > 0 and figures["fp32"].samples_per_s > 0
    assert figures["fp32"].size_bytes == quantization.size_bytes(model)
    assert figures["dynamic_int8"].size_bytes == quantization.size_bytes(dynamic)
