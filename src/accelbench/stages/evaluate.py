"""evaluate@V: the trained model on the test set: accuracy, loss, per-class scores, the
confusion matrix and inference throughput, on the device it was trained on.

It writes files only (compare logs them to the MLflow run `run.json` names), so it imports
neither MLflow nor, for a skipped variant, the model code. While it measures, it holds a GPU
or the CPU's turn on this host (`slots.tenancy`), and says what else ran there meanwhile.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from accelbench.core import phases
from accelbench.core.console import InputError, log
from accelbench.core.outputs import MetricsFiles, claim, remove_leftovers, staged, write_json
from accelbench.core.params import Params, VariantParams
from accelbench.core.results import (
    EvalResult,
    EvalSummary,
    ModelFile,
    RunRecord,
    Skipped,
    write_per_class_csv,
)
from accelbench.data.datasets import Dataset, by_name
from accelbench.system import slots
from accelbench.training.placement import evaluation_device  # imports torch: model files need it

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EvalInputs:
    dataset: Dataset
    batch_size: int
    test_subset: int


def select(params: Params) -> EvalInputs:
    return EvalInputs(
        by_name(params.data.dataset), params.train.eval_batch_size, params.train.test_subset
    )


def run(
    inputs: EvalInputs, model_path: Path, prepared_dir: Path, files: MetricsFiles
) -> EvalResult:
    finals = (
        files.eval_json,
        files.confusion_csv,
        files.confusion_png,
        files.per_class_csv,
        files.run_json,
    )
    claim(*finals)  # before any work: a user's file is never replaced
    remove_leftovers(*finals)
    with phases.phase("model"):
        model_file = ModelFile.load(model_path)
    name = model_file.variant
    phases.RECORDER.stage = f"evaluate@{name}"
    if not model_file.trained:
        return _record_untrained(model_file, files)
    variant = _trained_variant(model_file, model_path)
    with phases.phase("imports"):  # torch is in already (the model file); matplotlib is not
        from accelbench.evaluation import confusion
        from accelbench.training import build, engine

    # before CUDA starts, so it sees its GPU alone; one for a DDP variant too (one process)
    gpus = int(variant.uses_cuda)
    with slots.tenancy(name, stage="evaluate", gpus=gpus, cpu=variant.device == "cpu") as tenancy:
        dataset = inputs.dataset
        device, model = _model_on_device(model_file, model_path, variant, dataset, prepared_dir)
        with phases.phase("data"):
            size, subset, layout = inputs.batch_size, inputs.test_subset, variant.channels_last
            batches = build.eval_batches(
                dataset, prepared_dir, device, size, subset, channels_last=layout
            )
        with phases.phase("evaluation"):
            # Warm-up: on a GPU every batch shape (cuDNN autotunes each); on a CPU one batch.
            warmup = None if device.type == "cuda" else 1
            engine.evaluate(model, batches, variant, device, max_batches=warmup)
            result = engine.evaluate(model, batches, variant, device)
            labels = result.targets.numpy(), result.predictions.numpy()
            counts = confusion.matrix(*labels)
            per_class = confusion.class_scores(counts)
            f1 = float(np.mean([s.f1_score for s in per_class.values()])) if per_class else 0.0
        shared = tenancy.shared()
        summary = EvalSummary(
            result.accuracy, result.loss, f1, result.samples_per_s, per_class, shared_machine=shared
        )
    record = RunRecord(name, "trained", model_file.mlflow_run_id)
    title = f"{name}: confusion matrix (test set)"
    _record(
        files, summary, record, labels, lambda path: confusion.confusion_figure(path, counts, title)
    )
    log(f"evaluate {name}: test accuracy {result.accuracy:.2%}, macro F1 {summary.macro_f1:.4f}")
    return summary


def _model_on_device(
    model_file: ModelFile,
    model_path: Path,
    variant: VariantParams,
    dataset: Dataset,
    prepared_dir: Path,
) -> tuple[torch.device, torch.nn.Module]:
    """The device the variant evaluates on, started, and its trained model there."""
    import torch

    from accelbench.training import build, engine

    with phases.phase("device"):
        device = evaluation_device(model_file.variant, variant)
        engine.configure_backends(variant)
        engine.start_device(device)
    with phases.phase("model"):
        build.check_prepared(dataset, prepared_dir)
        model = build.trained_model(dataset, model_file.state_dict, str(model_path))
        # in the variant's memory layout, as it trained and was evaluated in training
        layout = torch.channels_last if variant.channels_last else torch.preserve_format
        return device, model.to(device, memory_format=layout)


def _record(
    files: MetricsFiles,
    result: EvalResult,
    record: RunRecord,
    labels: tuple[np.ndarray, np.ndarray] | None,
    draw: Callable[[Path], None],
) -> None:
    """The five outputs, all new or all old: `labels` are the test set's (actual, predicted),
    None for a skipped variant; `draw` writes confusion.png."""
    from accelbench.evaluation import confusion

    with phases.phase("outputs"), staged() as outputs:
        write_json(outputs(files.eval_json), result.to_json())
        write_per_class_csv(outputs(files.per_class_csv), result)
        confusion.write_confusion_csv(outputs(files.confusion_csv), labels)
        draw(outputs(files.confusion_png))
        write_json(outputs(files.run_json), record.to_json())


def _trained_variant(model_file: ModelFile, model_path: Path) -> VariantParams:
    """The variant's params as the model file recorded them."""
    try:
        saved = model_file.params["variant"]
        return VariantParams.model_validate({k: v for k, v in saved.items() if k != "name"})
    except (KeyError, TypeError, AttributeError, ValueError):
        raise InputError(
            f"{model_path}: its recorded variant params are missing or invalid; re-run train for it"
        ) from None


def _record_untrained(model_file: ModelFile, files: MetricsFiles) -> Skipped:
    from accelbench.evaluation import confusion

    skipped = Skipped(model_file.reason or "no reason recorded")
    record = RunRecord(model_file.variant, "skipped", None, model_file.params, model_file.reason)
    title = f"{model_file.variant}: {model_file.status}\n{skipped.reason}"
    _record(files, skipped, record, None, lambda path: confusion.placeholder_figure(path, title))
    log(f"evaluate {model_file.variant}: {model_file.status}")
    return skipped


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--metrics", type=Path, required=True)


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(select(params), args.model, args.data, MetricsFiles(args.metrics))
