"""compare: the comparison table and figures from every variant's results, logged to the
pipeline's MLflow run."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelbench.core import phases
from accelbench.core.console import InputError, log
from accelbench.core.params import Params, VariantParams
from accelbench.core.results import (
    ENV_DEVICES,
    EvalSummary,
    MetricsFiles,
    QuantizedSummary,
    RunRecord,
    env_json,
    read_epochs_csv,
    read_eval,
    read_quantized,
    read_run_record,
    read_train,
    refuse_foreign_folder,
    staged,
)
from accelbench.report import dvc_plots, markdown, pipeline_time
from accelbench.report.answer import Row
from accelbench.system import tracking


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
) -> dict[str, Any]:
    refuse_foreign_folder(out_dir)
    env = {d: _env_facts(env_json(env_dir, d)) for d in ENV_DEVICES}
    rows, tracked = [], []
    for name, variant in inputs.variants.items():
        files = MetricsFiles(metrics_dir / name)
        quantized = name in inputs.quantized
        needed = [files.train_json, files.eval_json, files.epochs_csv, files.run_json]
        for path in needed + ([files.quantized_json] if quantized else []):
            if not path.is_file():
                raise InputError(
                    f"{path}: missing; run `dvc repro` (or `accelbench train {name}`, "
                    "`accelbench evaluate` and `accelbench quantize`) before compare"
                )
        train, evaluated = read_train(files.train_json), read_eval(files.eval_json)
        row = Row(name, variant, train, evaluated, read_epochs_csv(files.epochs_csv))
        row.quantized = read_quantized(files.quantized_json) if quantized else None
        rows.append(row)
        tracked.append((read_run_record(files.run_json), row, files))
    with phases.phase("outputs"), staged() as outputs:  # all new or all old, never in place
        pipeline = pipeline_time.collect(phases.read_all(root), phases.RECORDER.timing())
        result = markdown.write_report(out_dir, rows, env, inputs.spec, pipeline, outputs)
        dvc_plots.write_plot_data(
            out_dir / dvc_plots.PLOTS_DIR,
            {row.name: row.epochs for row in rows},
            {row.name: row.eval.per_class for row in rows if isinstance(row.eval, EvalSummary)},
            outputs,
        )
    _track_variants(root, tracked, result.variants)
    run_id = tracking.finish_pipeline(root, result.files, result.headline)
    if run_id:
        log(f"compare: report logged to MLflow pipeline run {run_id}")
    log(f"compare: wrote {out_dir / 'comparison.md'}")
    return result.headline


def _track_variants(
    root: Path,
    tracked: list[tuple[RunRecord, Row, MetricsFiles]],
    figures: Mapping[str, Mapping[str, Any]],
) -> None:
    """Each variant's evaluation and figures in the run that trained it (logged without
    re-opening it, so its duration stays its training's), and each skipped variant as a run
    that says why: done here, once, so that evaluate and a skipped train never start MLflow."""
    by_run: dict[str, Mapping[str, Any]] = {}
    for record, row, files in tracked:
        if isinstance(row.eval, EvalSummary) and record.mlflow_run_id:
            artifacts = [files.confusion_png, files.eval_json, files.per_class_csv]
            more = None
            if isinstance(row.quantized, QuantizedSummary):
                artifacts.append(files.quantized_json)
                more = row.quantized.metrics()
            tracking.log_evaluation(root, record.mlflow_run_id, row.eval, artifacts, more)
            by_run[record.mlflow_run_id] = figures.get(record.variant, {})
        elif record.status == "skipped":
            tracking.record_skipped(
                root, record.variant, record.params or {}, record.reason or "no reason recorded"
            )
    tracking.log_variant_figures(root, by_run)


def _env_facts(path: Path) -> dict[str, Any]:
    try:
        facts = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: missing; run `accelbench env --out {path.parent}`") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc}); run `accelbench env` again") from None
    if not isinstance(facts, dict):
        raise InputError(f"{path}: not an env facts file; run `accelbench env` again")
    return facts


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(root, select(params), args.env, args.metrics, args.out)
