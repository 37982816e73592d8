"""stages/evaluate.py: an untrained (skipped) variant is recorded as such; a model trained on
CUDA is refused where there is none; the outputs are all new or all old."""

from __future__ import annotations

import pytest
import torch

from accelbench.core.console import StageError
from accelbench.core.outputs import MetricsFiles
from accelbench.core.results import EvalResult, ModelFile, Skipped, read
from accelbench.stages import evaluate
from helpers import small_params


def test_a_skipped_variant_is_recorded_as_skipped(tmp_path, prepared) -> None:
    ModelFile("gpu", "skipped", None, reason="no GPU here").save(tmp_path / "gpu.pt")
    files = MetricsFiles(tmp_path / "metrics")
    inputs = evaluate.select(small_params())
    assert evaluate.run(inputs, tmp_path / "gpu.pt", prepared, files) == Skipped("no GPU here")
    assert read(EvalResult, files.eval_json) == Skipped("no GPU here")
    assert files.confusion_csv.read_text() == "actual,predicted\n"
    assert files.confusion_png.stat().st_size > 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_a_model_trained_on_cuda_is_refused_without_cuda(tmp_path, prepared) -> None:
    params = {"variant": {"name": "gpu", "device": "cuda"}, "train": {}}
    ModelFile("gpu", "trained", None, params, {}).save(tmp_path / "gpu.pt")
    inputs = evaluate.select(small_params())
    with pytest.raises(StageError, match="the model was trained on CUDA"):
        evaluate.run(inputs, tmp_path / "gpu.pt", prepared, MetricsFiles(tmp_path))


@pytest.mark.parametrize("channels_last", [True, False])
def test_inference_is_measured_in_the_layout_the_variant_trained_in(
    tmp_path, prepared, monkeypatch, channels_last
) -> None:
    """cpu and gpu train in channels_last; their inference throughput was measured in NCHW."""
    from accelbench.training import engine
    from accelbench.training.models import SeedCNN

    variant = {"name": "cpu", "device": "cpu", "channels_last": channels_last}
    params = {"variant": variant, "train": {}}
    ModelFile("cpu", "trained", None, params, SeedCNN().state_dict()).save(tmp_path / "cpu.pt")
    seen = []
    evaluate_pass = engine.evaluate

    def watched(model, batches, *args, **kwargs):
        # conv2's: with one input channel, conv1's weight and MNIST's images fit both layouts
        seen.append(model.features[2].weight.is_contiguous(memory_format=torch.channels_last))
        return evaluate_pass(model, batches, *args, **kwargs)

    monkeypatch.setattr(engine, "evaluate", watched)
    evaluate.run(evaluate.select(small_params()), tmp_path / "cpu.pt", prepared,
                 MetricsFiles(tmp_path / "metrics"))  # fmt: skip
    assert seen and set(seen) == {channels_last}


def test_a_failed_figure_keeps_every_earlier_output(tmp_path, prepared, monkeypatch) -> None:
    """The figure fails (a full disk) after eval.json and the CSV were written: all old."""
    import errno

    from accelbench.evaluation import confusion

    ModelFile("gpu", "skipped", None, reason="no GPU here").save(tmp_path / "gpu.pt")
    files = MetricsFiles(tmp_path / "metrics")
    inputs = evaluate.select(small_params())
    evaluate.run(inputs, tmp_path / "gpu.pt", prepared, files)
    outputs = (files.eval_json, files.confusion_csv, files.confusion_png, files.run_json)
    outputs += (files.per_class_csv,)
    before = {p: p.read_bytes() for p in outputs}
    ModelFile("gpu", "skipped", None, reason="changed").save(tmp_path / "gpu.pt")

    def disk_full(path, text) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(confusion, "placeholder_figure", disk_full)
    with pytest.raises(OSError, match="No space left"):
        evaluate.run(inputs, tmp_path / "gpu.pt", prepared, files)
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in files.folder.iterdir()) == sorted(p.name for p in before)
