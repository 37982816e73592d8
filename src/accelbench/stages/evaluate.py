"""evaluate@V: the trained model on the test set: accuracy, loss, per-class scores, the
confusion matrix and inference throughput, on the device it was trained on."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import build, confusion, data, engine, tracking
from ..console import InputError, log
from ..params import Params, VariantParams
from ..placement import evaluation_device
from ..results import (
    ClassScores,
    EvalResult,
    EvalSummary,
    MetricsFiles,
    ModelFile,
    Skipped,
    remove_leftovers,
    staged,
    write_json,
)


@dataclass(frozen=True)
class EvalInputs:
    batch_size: int
    test_subset: int


def select(params: Params) -> EvalInputs:
    return EvalInputs(params.train.eval_batch_size, params.train.test_subset)


def run(
    root: Path, inputs: EvalInputs, model_path: Path, prepared_dir: Path, files: MetricsFiles
) -> EvalResult:
    remove_leftovers(files.eval_json, files.confusion_csv, files.confusion_png)
    model_file = ModelFile.load(model_path)
    name = model_file.variant
    if not model_file.trained:
        return _record_untrained(model_file, files)
    # The model file carries the params it was trained with: the variant is read from it.
    variant = _trained_variant(model_file, model_path)
    device = evaluation_device(name, variant)
    engine.configure_backends(variant)
    dataset = data.prepared_dataset(prepared_dir).name
    model = build.trained_model(model_file.state_dict, str(model_path), dataset).to(device)
    batches = build.eval_batches(prepared_dir, device, inputs.batch_size, inputs.test_subset)
    engine.evaluate(model, batches, variant, device)  # warm-up: kernels, autotuning
    result = engine.evaluate(model, batches, variant, device)
    y_true, y_pred = result.targets.numpy(), result.predictions.numpy()
    summary = _summary(result, y_true, y_pred)
    with staged() as outputs:  # all new or all old
        write_json(outputs(files.eval_json), summary.to_json())
        confusion.write_confusion_csv(outputs(files.confusion_csv), (y_true, y_pred))
        confusion.confusion_figure(
            outputs(files.confusion_png),
            confusion.matrix(y_true, y_pred),
            f"{name}: confusion matrix (test set)",
        )
    if not model_file.mlflow_run_id:
        log(
            f"evaluate {name}: training was not tracked in MLflow; results are in {files.eval_json}"
        )
        return summary
    # Tracking calls are tolerant: a store reset since training is reported once, as an outage.
    with tracking.resume_run(root, model_file.mlflow_run_id):
        tracking.log_eval_summary(summary)
        tracking.log_artifact(files.confusion_png)
        tracking.log_artifact(files.eval_json)
    log(f"evaluate {name}: test accuracy {result.accuracy:.2%}, macro F1 {summary.macro_f1:.4f}")
    return summary


def _trained_variant(model_file: ModelFile, model_path: Path) -> VariantParams:
    """The variant's params as the model file recorded them."""
    try:
        saved = model_file.params["variant"]
        return VariantParams.model_validate({k: v for k, v in saved.items() if k != "name"})
    except (KeyError, TypeError, AttributeError, ValueError):
        raise InputError(
            f"{model_path}: its recorded variant params are missing or invalid; re-run train for it"
        ) from None


def _summary(result: engine.EvalResult, y_true: np.ndarray, y_pred: np.ndarray) -> EvalSummary:
    from sklearn.metrics import classification_report

    scores = classification_report(y_true, y_pred, output_dict=True, zero_division=0)
    return EvalSummary(
        test_accuracy=result.accuracy,
        test_loss=result.loss,
        macro_f1=scores["macro avg"]["f1-score"],
        inference_samples_per_s=result.samples_per_s,
        per_class={
            str(c): ClassScores(
                scores[str(c)]["precision"], scores[str(c)]["recall"], scores[str(c)]["f1-score"]
            )
            for c in range(10)
            if str(c) in scores
        },
    )


def _record_untrained(model_file: ModelFile, files: MetricsFiles) -> Skipped:
    skipped = Skipped(model_file.reason or "no reason recorded")
    with staged() as outputs:
        write_json(outputs(files.eval_json), skipped.to_json())
        confusion.write_confusion_csv(outputs(files.confusion_csv), None)
        confusion.placeholder_figure(
            outputs(files.confusion_png),
            f"{model_file.variant}: {model_file.status}\n{skipped.reason}",
        )
    log(f"evaluate {model_file.variant}: {model_file.status}")
    return skipped


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(root, select(params), args.model, args.data, MetricsFiles(args.metrics))
