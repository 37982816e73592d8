"""stages/quantize.py: fp32 and int8 figures of a trained model, a skipped variant at once."""

from __future__ import annotations

import json

import pytest

from accelbench.core.outputs import MetricsFiles
from accelbench.core.results import (
    QUANT_METHODS,
    ModelFile,
    QuantizedResult,
    QuantizedSummary,
    Skipped,
    read,
)
from accelbench.stages import quantize, train
from helpers import small_params


def test_a_skipped_variant_is_recorded_without_loading_anything(tmp_path) -> None:
    ModelFile("gpu", "skipped", None, reason="no GPU here").save(tmp_path / "gpu.pt")
    files = MetricsFiles(tmp_path / "metrics")
    inputs = quantize.select(small_params())
    # No prepared data at all: a skipped variant never reads it.
    result = quantize.run(tmp_path, inputs, tmp_path / "gpu.pt", tmp_path / "none", files)
    assert result == Skipped("no GPU here") == read(QuantizedResult, files.quantized_json)


def _trained(tmp_path, prepared) -> train.TrainOutputs:
    params = small_params(epochs=1)
    out = train.TrainOutputs(tmp_path / "cpu.pt", MetricsFiles(tmp_path / "metrics"))
    train.run(tmp_path, "cpu", train.select(params, "cpu"), prepared, out, quiet=True)
    return out


@pytest.mark.slow
def test_a_trained_model_gets_fp32_and_int8_figures(tmp_path, prepared) -> None:
    out = _trained(tmp_path, prepared)
    inputs = quantize.select(small_params())
    result = quantize.run(tmp_path, inputs, out.model, prepared, out.metrics)

    assert isinstance(result, QuantizedSummary)
    assert read(QuantizedResult, out.metrics.quantized_json) == result
    fp32, dynamic = result.methods["fp32"], result.methods["dynamic_int8"]
    assert set(result.methods) | set(result.unsupported) == set(QUANT_METHODS)
    assert fp32.size_bytes > 2 * dynamic.size_bytes  # the Linear holds 99% of the weights
    train_json = json.loads(out.metrics.train_json.read_text())
    assert fp32.test_accuracy == train_json["final_test_accuracy"]
    assert abs(dynamic.test_accuracy - fp32.test_accuracy) < 0.05
    assert result.metrics()["quant_dynamic_int8_latency_ms"] == dynamic.latency_ms


@pytest.mark.slow
def test_a_build_without_static_int8_gets_a_stated_reason(tmp_path, prepared, monkeypatch) -> None:
    from accelbench.evaluation import quantization

    out = _trained(tmp_path, prepared)
    monkeypatch.setattr(quantization, "static_int8_unsupported", lambda: "no x86 engine")
    result = quantize.run(
        tmp_path, quantize.select(small_params()), out.model, prepared, out.metrics
    )
    assert set(result.methods) == {"fp32", "dynamic_int8"}
    assert result.unsupported == {"static_int8": "no x86 engine"}
