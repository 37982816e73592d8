"""oom.py: a CUDA out-of-memory error halves the samples per pass (same batch) up to
train.oom_retries times, or ends the stage saying what to change."""

from __future__ import annotations

import pytest
import torch

from accelbench.core.console import StageError
from accelbench.core.outputs import MetricsFiles
from accelbench.core.results import TrainResult, read
from accelbench.stages import train as train_stage
from accelbench.training import engine
from accelbench.training.oom import retry_on_oom
from accelbench.training.placement import Placement
from helpers import small_params

CPU = Placement(torch.device("cpu"), "Test CPU")


def _oom_when_passes_exceed(limit: int, monkeypatch):
    real_fit = engine.fit
    tried = []

    def fit(model, train_batches, test_batches, spec, *args, **kwargs):
        per_pass = spec.recipe.batch_size // spec.accumulation_steps
        tried.append(per_pass)
        if per_pass > limit:  # what the allocator would say on a GPU that is too small
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_fit(model, train_batches, test_batches, spec, *args, **kwargs)

    monkeypatch.setattr(engine, "fit", fit)
    return tried


def _train_cpu(tmp_path, prepared, params):
    out = train_stage.TrainOutputs(tmp_path / "cpu.pt", MetricsFiles(tmp_path / "metrics"))
    inputs = train_stage.select(params, "cpu")
    train_stage.run(tmp_path, "cpu", inputs, prepared, out, quiet=True)
    return out


def _fits_passes_of(limit: int, tried: list):
    def attempt(accumulation: int, fresh: bool) -> str:
        tried.append((128 // accumulation, fresh))
        if 128 // accumulation > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return "trained"

    return attempt


def test_each_retry_halves_the_pass_from_scratch_until_the_retries_run_out() -> None:
    """retry_on_oom alone (the fast tier's); the stage's own tests below train through it."""
    tried: list = []
    args = {"name": "cpu", "batch_size": 128, "accumulation_steps": 1, "placement": CPU}
    assert retry_on_oom(_fits_passes_of(40, tried), retries=3, **args) == ("trained", 4)
    assert tried == [(128, False), (64, True), (32, True)]
    with pytest.raises(StageError, match=r"batch 128 \(64 samples per .*oom_retries") as info:
        retry_on_oom(_fits_passes_of(40, []), retries=1, **args)
    assert isinstance(info.value.__cause__, torch.cuda.OutOfMemoryError)


@pytest.mark.slow
def test_out_of_memory_halves_the_pass_and_keeps_the_batch(
    tmp_path, prepared, mlflow_store, monkeypatch
) -> None:
    tried = _oom_when_passes_exceed(40, monkeypatch)
    params = small_params(oom_retries=3)  # batch 128: 128 -> 64 -> 32 samples per pass
    out = _train_cpu(tmp_path, prepared, params)
    assert tried == [128, 64, 32]
    summary = read(TrainResult, out.metrics.train_json)
    assert summary.accumulation_steps == 4 and summary.status == "trained"


@pytest.mark.slow
def test_out_of_memory_without_retries_explains_what_to_change(
    tmp_path, prepared, mlflow_store, monkeypatch
) -> None:
    _oom_when_passes_exceed(40, monkeypatch)
    with pytest.raises(StageError) as info:
        _train_cpu(tmp_path, prepared, small_params())
    message = str(info.value)
    assert "batch 128" in message and "accumulation_steps" in message and "oom_retries" in message
    assert not (tmp_path / "cpu.pt").exists()
