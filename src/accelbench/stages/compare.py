"""compare: the comparison table and figures from every variant's results, logged to the
pipeline's MLflow run."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelbench.core import phases
from accelbench.core.console import InputError, log
from accelbench.core.env_facts import read_env
from accelbench.core.outputs import (
    ENV_DEVICES,
    MetricsFiles,
    env_json,
    refuse_foreign_folder,
    staged,
)
from accelbench.core.params import Params, VariantParams
from accelbench.core.results import (
    EvalResult,
    EvalSummary,
    QuantizedResult,
    QuantizedSummary,
    RunRecord,
    TrainResult,
    TrainSummary,
    read,
    read_epoch_records,
)
from accelbench.report import dvc_plots, markdown, pipeline_time
from accelbench.report.answer import Row
from accelbench.system import tracking
from accelbench.system.tracking.baseline import show_beside_baseline


@dataclass(frozen=True)
class CompareInputs:
    variants: Mapping[str, VariantParams]
    spec: markdown.ReportSpec
    quantized: tuple[str, ...] = ()  # the variants with a quantize@V stage


def select(params: Params) -> CompareInputs:
    train = params.train
    recipe = (
        f"batch {train.batch_size}, {train.epochs} epochs, Adam lr {train.lr:g}, "
        f"schedule {train.schedule}, seed {train.seed}"
        + (f", training subset {train.train_subset}" if train.train_subset else "")
        + (f", test subset {train.test_subset}" if train.test_subset else "")
    )
    spec = markdown.ReportSpec(
        target_accuracy=train.target_accuracy,
        speedup_baseline=params.report.speedup_baseline,
        scaling_baselines=params.report.scaling_baselines,
        recipe=recipe,
        cost=params.cost,
        dataset=params.data.dataset,
    )
    return CompareInputs(params.variants, spec, tuple(params.quantize.variants))


def run(
    root: Path, inputs: CompareInputs, env_dir: Path, metrics_dir: Path, out_dir: Path
) -> dict[str, float]:
    """The report in `out_dir`, logged to MLflow; returns the pipeline run's metrics."""
    refuse_foreign_folder(out_dir)
    _require_inputs(inputs, env_dir, metrics_dir)  # every one, before any is read
    env = read_env(env_dir)
    rows, tracked = [], []
    for name, variant in inputs.variants.items():
        files = MetricsFiles(metrics_dir / name)
        train, evaluated = read(TrainResult, files.train_json), read(EvalResult, files.eval_json)
        row = Row(name, variant, train, evaluated, read_epoch_records(files.epochs_csv))
        if row.trained and not row.epochs:  # the timings, the cost and the curves are in it
            raise InputError(
                f"{files.epochs_csv}: no epochs, though {files.train_json.name} says {name!r} "
                f"trained; train it again (`dvc repro train@{name}`)"
            )
        if name in inputs.quantized:
            row.quantized = read(QuantizedResult, files.quantized_json)
        record = read(RunRecord, files.run_json)
        if record.variant != name:  # `accelbench evaluate --metrics` named another's folder
            raise InputError(
                f"{files.run_json}: the evaluation of variant {record.variant!r}, in the folder "
                f"of {name!r}; evaluate {name!r} again (`dvc repro evaluate@{name}`, or "
                f"`accelbench evaluate` with its model and --metrics {files.folder})"
            )
        rows.append(row)
        tracked.append((record, row, files))
    with phases.phase("outputs"), staged() as outputs:  # all new or all old, never in place
        stages = {f"{stage}@{v}" for v in inputs.variants for stage in ("train", "evaluate")}
        stages |= {f"quantize@{v}" for v in inputs.quantized}
        timings = pipeline_time.of_pipeline(phases.read_all(root), stages)
        pipeline = pipeline_time.collect(timings, phases.RECORDER.timing())
        to_model = {t.stage: t.to_model_s for t in timings}
        for row in rows:  # end to end: the train stage, process start to its model
            row.stage_to_model_s = to_model.get(f"train@{row.name}") if row.trained else None
        result = markdown.write_report(out_dir, rows, env, inputs.spec, pipeline, outputs)
        epochs = {row.name: row.epochs for row in rows}
        per_class = {r.name: r.eval.per_class for r in rows if isinstance(r.eval, EvalSummary)}
        dvc_plots.write_plot_data(out_dir / dvc_plots.PLOTS_DIR, epochs, per_class, outputs)
    reported = _track_variants(root, tracked, result.comparison, inputs.spec.speedup_baseline)
    run_id = tracking.finish_pipeline(root, result.files, result.pipeline_metrics, reported)
    if run_id:
        log(f"compare: report logged to MLflow pipeline run {run_id}")
        if beside := show_beside_baseline(root, run_id):  # a DVC experiment's
            log(f"compare: {beside.line()}")
            log(f"compare: in MLflow: {beside.link}")
    log(f"compare: wrote {out_dir / 'comparison.md'}")
    return result.pipeline_metrics


def _require_inputs(inputs: CompareInputs, env_dir: Path, metrics_dir: Path) -> None:
    """An InputError naming the first input that is missing and the stage that writes it."""
    for device in ENV_DEVICES:
        if not (path := env_json(env_dir, device)).is_file():
            raise InputError(f"{path}: missing; run `accelbench env --out {env_dir}`")
    for name in inputs.variants:
        files = MetricsFiles(metrics_dir / name)
        needed = [files.train_json, files.eval_json, files.epochs_csv, files.run_json]
        for path in needed + ([files.quantized_json] if name in inputs.quantized else []):
            if not path.is_file():
                raise InputError(
                    f"{path}: missing; run `dvc repro` (or `accelbench train {name}`, "
                    "`accelbench evaluate` and `accelbench quantize`) before compare"
                )


def _track_variants(
    root: Path,
    tracked: list[tuple[RunRecord, Row, MetricsFiles]],
    comparison: Mapping[str, Mapping[str, Any]],
    speedup_baseline: str | None,
) -> list[str]:
    """Each variant's evaluation and figures in the run that trained it (not re-opened: its
    duration stays its training's), each skipped variant as a run that says why (here, so that
    evaluate and a skipped train never start MLflow). Returns the runs: evaluated, skipped."""
    by_run: dict[str, Mapping[str, Any]] = {}
    skipped: list[str] = []
    for record, row, files in tracked:
        if isinstance(row.eval, EvalSummary) and record.mlflow_run_id:
            if isinstance(row.train, TrainSummary):  # tracking down while it trained
                ended_ms = int(files.train_json.stat().st_mtime * 1000)
                tracking.catch_up(root, record.mlflow_run_id, row.epochs, row.train, ended_ms)
            artifacts = [files.confusion_png, files.eval_json, files.per_class_csv]
            more = None
            if isinstance(row.quantized, QuantizedSummary):
                artifacts.append(files.quantized_json)
                more = row.quantized.metrics()
            tracking.log_evaluation(root, record.mlflow_run_id, row.eval, artifacts, more)
            by_run[record.mlflow_run_id] = comparison[row.name]
        elif record.status == "skipped":
            run_id = tracking.record_skipped(
                root, record.variant, record.params or {}, record.reason or "no reason recorded"
            )
            skipped += [run_id] if run_id else []
    tracking.log_variant_figures(root, by_run, speedup_baseline)
    return list(by_run) + skipped


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", type=Path, required=True, help="the env stage's folder")
    parser.add_argument("--metrics", type=Path, required=True, help="the variants' metrics")
    parser.add_argument("--out", type=Path, required=True, help="folder for the report")


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(root, select(params), args.env, args.metrics, args.out)
