"""What a variant's run holds: per-epoch and summary metrics, the data it used, its model and
files, and, logged by compare, the evaluation and the headline figures (metrics and tags)."""

from __future__ import annotations

import importlib
import logging
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

import mlflow
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis

from accelbench.core import phases
from accelbench.core.console import log
from accelbench.core.progress import fmt_interval, fmt_ratio, fmt_seconds
from accelbench.core.results import EpochRecord, EvalSummary, TrainSummary
from accelbench.system.tracking.dead_runs import CLOSED_TAG, why_gone
from accelbench.system.tracking.outage import tolerant
from accelbench.system.tracking.store import once_more_on_conflict, run_in_store, setup

SHARE_WORDS = ("accuracy", "f1", "fraction")  # in the names of metrics that are a share of 1


def rounded(name: str, value: float) -> float:
    """`value` as precise as it is meaningful: a share (`SHARE_WORDS`) to 4 decimals (0.01%),
    else 4 significant digits, seconds (`*_s`, not `*_per_s`) at least to the millisecond."""
    if not math.isfinite(value) or value.is_integer():
        return value
    if any(word in name for word in SHARE_WORDS):
        return round(value, 4)
    digits = 3 - math.floor(math.log10(abs(value)))  # 4 significant digits
    figure = name.removesuffix("_lo").removesuffix("_hi")  # an interval's ends as its figure
    if figure.endswith("_s") and not figure.endswith("_per_s"):
        digits = max(digits, 3)
    return round(value, digits)


@tolerant
def log_metrics(metrics: Mapping[str, float | int | None], step: int | None = None) -> None:
    clean = {k: rounded(k, float(v)) for k, v in metrics.items() if isinstance(v, int | float)}
    if clean:
        mlflow.log_metrics(clean, step=step)


def _finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of `metrics` (None, NaN and non-numbers are left out)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _metrics(values: Mapping[str, Any], step: int = 0, **against: str | None) -> list[Metric]:
    """The finite numbers of `values`, `rounded`, as metrics at `step`."""
    now = get_current_time_millis()
    return [Metric(k, rounded(k, v), now, step, **against) for k, v in _finite(values).items()]


@tolerant
def log_dataset(name: str, images, labels, source: Path, digest: str, context: str) -> None:
    """The data a run used, as an MLflow dataset input (its digest from the verified checksums)."""
    import mlflow.data

    with warnings.catch_warnings():
        # MLflow registers its local-file source class twice and says so on every resolve.
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        dataset = mlflow.data.from_numpy(
            images, targets=labels, source=str(source.resolve()), name=name, digest=digest
        )
    once_more_on_conflict(lambda: mlflow.log_input(dataset, context=context))


@tolerant
def log_evaluation(
    root: Path,
    run_id: str,
    summary: EvalSummary,
    artifacts: list[Path],
    more_metrics: Mapping[str, float | int | None] | None = None,
) -> None:
    """An evaluated variant's figures and files, in the run that trained it; the figures against
    its model and evaluation dataset (MLflow's models view ranks them), `more_metrics` plainly."""
    setup(root)
    client = MlflowClient()
    if (run := run_in_store(client, run_id)) is None:
        log(
            f"MLflow run {run_id} is not in {mlflow.get_tracking_uri()} (the store was deleted "
            "or replaced after it trained): its evaluation is not logged; `dvc repro --force "
            "train@<variant>` tracks the variant again"
        )
        return
    dataset = next(
        (
            logged.dataset
            for logged in (run.inputs.dataset_inputs if run.inputs else [])
            if any(t.key == "mlflow.data.context" and t.value == "evaluation" for t in logged.tags)
        ),
        None,
    )
    models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'", max_results=1
    )
    against = {
        "model_id": models[0].model_id if models else None,
        "dataset_name": dataset.name if dataset else None,
        "dataset_digest": dataset.digest if dataset else None,
        "run_id": run_id,
    }
    evaluation = {
        "eval_test_accuracy": summary.test_accuracy,
        "eval_test_loss": summary.test_loss,
        "eval_macro_f1": summary.macro_f1,
        "inference_samples_per_s": summary.inference_samples_per_s,
    }
    metrics = _metrics(evaluation, **against) + _metrics(more_metrics or {})
    client.log_batch(run_id, metrics=metrics)
    for path in artifacts:
        client.log_artifact(run_id, str(path))


@tolerant
def catch_up(
    root: Path, run_id: str, epochs: Sequence[EpochRecord], summary: TrainSummary, ended_ms: int
) -> None:
    """What a variant's run lacks because tracking was down while it trained: its epochs,
    summary figures and, where it is RUNNING with its process gone, its end (FINISHED)."""
    setup(root)
    client = MlflowClient()
    if (run := run_in_store(client, run_id)) is None:  # log_evaluation says so
        return
    logged = {m.step for m in client.get_metric_history(run_id, "test_accuracy")}
    missed = [record for record in epochs if record.epoch not in logged]
    figures = [m for m in _metrics(summary.metrics()) if m.key not in run.data.metrics]
    metrics = figures + [m for r in missed for m in _metrics(r.metrics(), r.epoch)]
    why = why_gone(run.data.tags) if run.info.status == "RUNNING" else None
    if not metrics and why is None:
        return
    client.log_batch(run_id, metrics=metrics)
    said = [f"epoch {r.epoch}" for r in missed] + (["its summary"] if figures else [])
    said = [f"logged {', '.join(said)}"] if said else []
    if why is not None:
        client.set_tag(run_id, CLOSED_TAG, "ended by compare: its train stage ended while "
                       "tracking was down")  # fmt: skip
        client.set_terminated(run_id, "FINISHED", end_time=ended_ms)
        said.append("ended it FINISHED, as its train stage ended while tracking was down")
    name = run.data.tags.get("variant", run.info.run_name)
    log(f"{name}: MLflow run {run_id} caught up with its train stage: {'; '.join(said)}")


# Headline figures a variant run carries as text: tag -> (figure in comparison.json, formatter).
FIGURE_TAGS: dict[str, tuple[str, Callable[[float], str]]] = {
    "speedup": ("speedup_vs_cpu", fmt_ratio),
    "steady_epoch": ("steady_epoch_s", fmt_seconds),
    "time_to_target": ("time_to_target_s", fmt_seconds),
    "speedup_vs_fp32": ("speedup_vs_fp32", fmt_ratio),
}
# The variant every `speedup` tag is over (report.speedup_baseline), as a tag of each run.
SPEEDUP_BASELINE_TAG = "speedup_baseline"


def figure_text(figures: Mapping[str, float], name: str, fmt: Callable[[float], str]) -> str | None:
    """`figures[name]` and, where both ends are there, its 95% interval ("148× (140–156×)")."""
    if (value := figures.get(name)) is None:
        return None
    return fmt_interval(value, figures.get(f"{name}_lo"), figures.get(f"{name}_hi"), fmt)


@tolerant
def log_variant_figures(
    root: Path,
    figures: Mapping[str, Mapping[str, float | None]],
    speedup_baseline: str | None = "cpu",
) -> None:
    """Each variant's headline figures, keyed by its run id, as metrics of that run and the
    key ones as text tags (a tag for a figure now None removed). Through the client, so runs
    keep their start and end. A figure logged with the same value, or per epoch, is not again."""
    setup(root)
    client = MlflowClient()
    series = {f.name for f in fields(EpochRecord)}
    wanted = {k: v for k, v in FIGURE_TAGS.items() if k != "speedup"}
    if speedup_baseline is not None:  # the speedup over it; none: no speedup tag
        wanted["speedup"] = (f"speedup_vs_{speedup_baseline}", fmt_ratio)
    for run_id, values in figures.items():
        if (run := run_in_store(client, run_id)) is None:  # log_evaluation said so
            continue
        logged = run.data.metrics
        tags = {  # from the figures as compare has them: the tag reads as the report
            tag: figure_text(_finite(values), *wanted[tag]) if tag in wanted else None
            for tag in FIGURE_TAGS
        }
        tags[SPEEDUP_BASELINE_TAG] = speedup_baseline
        client.log_batch(
            run_id,
            metrics=[
                m
                for m in _metrics(values)
                if m.key not in logged or (logged[m.key] != m.value and m.key not in series)
            ],
            tags=[RunTag(k, v) for k, v in tags.items() if v is not None],
        )
        for key in [k for k, v in tags.items() if v is None and k in run.data.tags]:
            client.delete_tag(run_id, key)


@tolerant
def log_artifact(path: Path, artifact_path: str | None = None) -> None:
    mlflow.log_artifact(str(path), artifact_path=artifact_path)


@tolerant
def log_model(model, input_example, name: str) -> None:
    """The trained model, its signature inferred from an input example, named after its variant."""
    import torch

    with phases.phase("model_logging"), torch.no_grad(), _quick_and_quiet():
        output = model(torch.as_tensor(input_example)).numpy()
        signature = mlflow.models.infer_signature(input_example, output)
        pytorch_flavour().log_model(
            model,
            name=name,
            signature=signature,
            input_example=input_example,
            # not MLflow 3's default pt2: a model exported on the CPU cannot be re-loaded onto
            # a GPU, which MLflow tries when it validates the example
            serialization_format="pickle",
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
        )


def pytorch_flavour() -> ModuleType:
    """MLflow's PyTorch flavour, imported without PyTorch Lightning (and what it imports: 4.6 s
    for an autologging callback accelbench never uses). A None in `sys.modules` makes that
    import an ImportError, which MLflow's flavour handles as Lightning not installed."""
    if (flavour := sys.modules.get("mlflow.pytorch")) is not None:
        return flavour
    blocked = "pytorch_lightning" not in sys.modules
    if blocked:
        sys.modules["pytorch_lightning"] = None  # type: ignore[assignment]
    try:
        return importlib.import_module("mlflow.pytorch")
    finally:
        if blocked and sys.modules.get("pytorch_lightning", False) is None:
            del sys.modules["pytorch_lightning"]


@contextmanager
def _quick_and_quiet() -> Iterator[None]:
    """Logging a model without MLflow's caution about pickled models (these are our own), nor
    its scan mapping every installed distribution to its modules (0.5 s): ours, torch and
    mlflow, are found without the map, so an empty one keeps the requirements check."""
    from mlflow.utils import requirements_utils

    # None: not built yet; anything else (built, or renamed) is left alone
    scan = getattr(requirements_utils, "_MODULES_TO_PACKAGES", ()) is None
    if scan:
        requirements_utils._MODULES_TO_PACKAGES = {}
    logger = logging.getLogger("mlflow.pytorch")
    caution = "by Pickle or CloudPickle format requires exercising caution"
    logger.addFilter(quiet := lambda record: caution not in str(record.msg))
    try:
        yield
    finally:
        logger.removeFilter(quiet)
        if scan:
            requirements_utils._MODULES_TO_PACKAGES = None
            requirements_utils._PACKAGES_TO_MODULES = None
