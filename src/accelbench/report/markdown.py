"""The comparison, from the variants' typed results: comparison.md (its sections and tables
here, its wording in prose.py, its figure in summary_figure.py), comparison.json and DVC's
metrics files."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelbench.core import spread
from accelbench.core.env_facts import EnvFacts
from accelbench.core.outputs import (
    FIGURE,
    Kind,
    StagedOutputs,
    json_kind,
    json_payload,
    staged,
    text_kind,
    write_json,
)
from accelbench.core.params import CostParams, VariantParams
from accelbench.core.progress import fmt_seconds
from accelbench.core.results import (
    QUANT_METHODS,
    EvalSummary,
    QuantizedSummary,
    Skipped,
    TrainSummary,
    scaling_efficiency,
    speedup,
)
from accelbench.report import answer, pipeline_time, prose
from accelbench.report.answer import Row, VariantFigures, shared_machine, time_to_target
from accelbench.report.costs import RunCost, costs_to_target, usd_per_1000
from accelbench.report.pipeline_time import PipelineTime
from accelbench.report.summary_figure import summary_figure


@dataclass(frozen=True)
class ReportSpec:
    """What the report needs from params.yaml (the compare stage's keys, no more)."""

    target_accuracy: float
    speedup_baseline: str | None  # the variant every "speedup vs" is measured against
    scaling_baselines: Mapping[str, str]  # DDP variant -> its single-process baseline
    recipe: str  # one line: batch, epochs, lr, schedule, seed, subsets
    cost: CostParams | None = None  # prices for the cost table (None: no cost table)
    dataset: str = "mnist"  # the tutorials' published figures are MNIST's: shown only with it


METRICS_DIR = "metrics"  # reports/metrics/<variant>.json: what `dvc metrics show` prints


def _variant_metrics_file(path: Path) -> bool:
    """A flat JSON object of numbers (empty: a skipped variant's)."""
    payload = json_payload(path)
    return isinstance(payload, dict) and all(
        value is None or isinstance(value, int | float) for value in payload.values()
    )


def _is_comparison(payload: Any) -> bool:
    """comparison.json's shape: each variant's entry, with its status."""
    return isinstance(payload, dict) and all(
        isinstance(values, dict) and "status" in values for values in payload.values()
    )


# What compare writes, as it recognises its earlier outputs (anything else there is refused).
VARIANT_METRICS = Kind("a metrics file written by `accelbench compare`", _variant_metrics_file)
COMPARISON_MD = text_kind("a comparison.md written by `accelbench compare`", prose.TITLE)
COMPARISON_JSON = Kind(
    "a comparison.json written by `accelbench compare`", lambda p: _is_comparison(json_payload(p))
)
PIPELINE_TIME_JSON = json_kind(
    "a pipeline_time.json written by `accelbench compare`", "span_s", "stages"
)


def reported_variants(comparison_json: Path) -> set[str]:
    """The variants an earlier comparison.json (compare's own) reported on; none without one."""
    payload = json_payload(comparison_json) if comparison_json.is_file() else None
    return set(payload) if _is_comparison(payload) else set()


def write_variant_metrics(
    folder: Path,
    metrics: Mapping[str, Mapping[str, Any]],
    outputs: StagedOutputs | None = None,
    earlier: Collection[str] = (),
) -> None:
    """A file per variant of the figures a user compares, numbers only: `dvc metrics show`
    prints a row per variant, `dvc exp show` a column per figure. Of the other files there,
    only those of variants the `earlier` report had and this one lacks are removed."""
    if outputs is None:
        with staged() as outputs:
            return write_variant_metrics(folder, metrics, outputs, earlier)
    for name in sorted(set(earlier) - set(metrics)):  # since removed from params.yaml
        stale = folder / f"{name}.json"
        if stale.is_file() and _variant_metrics_file(stale):
            outputs.remove(stale, VARIANT_METRICS)
    for name, values in metrics.items():
        numbers = {k: v for k, v in values.items() if isinstance(v, int | float)}
        write_json(outputs(folder / f"{name}.json", VARIANT_METRICS), numbers)


@dataclass
class ReportResult:
    files: list[Path]
    pipeline_metrics: dict[str, float]  # the pipeline run's: `<variant>.<figure>`
    comparison: dict[str, dict[str, Any]]  # comparison.json, by variant


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return "n/a"
    return {
        "s": fmt_seconds(value),
        "x": f"{value:.1f}×" if isinstance(value, float) else str(value),
        "pct": f"{value:.2%}",
        "pct0": f"{value:.0%}",
        "int": f"{value:,.0f}",
        "mib": f"{value:,.0f} MiB",
        "j": f"{value:,.0f} J",
    }[kind]


def _columns(names: str, spec: ReportSpec | None = None, **fields: Any) -> list[str]:
    """A table's column names (prose's, as its first line reads), with the report's baseline
    and target filled in."""
    if spec is not None:
        baseline = spec.speedup_baseline or prose.NO_BASELINE
        fields |= {"baseline": baseline, "target": f"{spec.target_accuracy:.1%}"}
    return names.format(**fields).split(" | ")


def _precision_mode(variant: VariantParams) -> str:
    if variant.precision == "fp32" and variant.device == "cuda":
        return "fp32 (TF32 matmul)" if variant.tf32 else "fp32 (strict)"
    return variant.precision


def _answer_table(
    rows: list[Row], figures: Mapping[str, VariantFigures], spec: ReportSpec
) -> list[str]:
    """The compact table under the headline (at most eight columns, spreads included), and
    the notes under it."""
    compared = len(figures) > 1  # a speedup column needs two variants to compare
    head = _columns(prose.ANSWER_COLUMNS, spec)
    if not compared:
        del head[prose.SPEEDUP_COLUMN]
    cells = [_answer_cells(row, figures.get(row.name), spec, compared) for row in rows]
    gpu_trained = any(r.trained and r.variant.device == "cuda" for r in rows)
    notes = answer.shared_notes(rows)
    return [
        *prose.table(head, cells),
        "",
        prose.ANSWER_NOTE.format(
            samples=_samples_note(rows, figures), method=spread.METHOD, one_seed=_one_seed(rows)
        ),
        *(["", *notes] if notes else []),
        *_skipped_lines(rows),
        *(["", prose.H200_POINTER] if spec.dataset == "mnist" and not gpu_trained else []),
    ]


def _answer_cells(
    row: Row, f: VariantFigures | None, spec: ReportSpec, compared: bool
) -> list[str]:
    if f is None:  # skipped, or no steady epoch: one epoch, or each a warm-up or stopped
        why = prose.SKIPPED_CELL
        if row.trained:
            why = prose.ONE_EPOCH if row.train.epochs == 1 else prose.NO_STEADY_EPOCH
        accuracy = _cell(row.test_accuracy, "pct") if row.trained else "—"  # tested, untimed
        device = f"{row.variant.device}, {row.variant.precision}"
        return [row.name, device, why, *["—"] * (compared + 2), accuracy, "—"]
    t = row.train
    to_target = (
        f"{answer.fmt_time(f.to_target)}, epoch {f.target_epoch}"
        if f.to_target
        else prose.NOT_REACHED
    )
    if f.to_target and t.compile_cache:
        to_target += f" ({t.compile_cache} compile)"
    if f.seeds is not None:
        to_target += f"; {f.seeds.text()}"
    speed = "baseline" if row.name == spec.speedup_baseline else answer.fmt_speedup(f.speedup)
    whole = _costs(row, spec)[0] if spec.cost else None
    return [
        f"**{row.name}**" + (f" {answer.SHARED_MARK}" if shared_machine(row) else ""),
        f"{t.device_name}, {_precision_mode(row.variant)}",
        answer.fmt_time(f.steady_epoch),
        *([speed] if compared else []),
        to_target,
        _cell(row.stage_to_model_s, "s") if row.stage_to_model_s else "n/a",
        _cell(row.test_accuracy, "pct"),
        usd_per_1000(whole.total_usd) if whole else "n/a",
    ]


def _one_seed(rows: list[Row]) -> str:
    """Which trained variants trained one seed only (`repeats: 1`)."""
    one = [r.name for r in rows if isinstance(r.train, TrainSummary) and r.train.repeats == 1]
    return prose.ONE_SEED.format(names=", ".join(one)) if one else prose.SEVERAL_SEEDS


def _skipped_lines(rows: list[Row]) -> list[str]:
    """Each distinct reason for skipping once, with the variants it skipped."""
    reasons: dict[str, list[str]] = {}
    for row in (r for r in rows if not r.trained):
        reasons.setdefault(row.train.reason, []).append(row.name)
    skipped = (prose.SKIPPED.format(names=", ".join(n), reason=r) for r, n in reasons.items())
    return [line for text in skipped for line in ("", text)]


def _samples_note(rows: list[Row], figures: Mapping[str, VariantFigures]) -> str:
    """How many steady epochs and trainings each figure rests on."""
    counts = {(f.steady_epoch.samples, r.train.repeats) for r in rows if (f := figures.get(r.name))}
    if len(counts) == 1:
        samples, repeats = counts.pop()
        trainings = prose.ONE_TRAINING if repeats == 1 else prose.TRAININGS.format(n=repeats)
        epochs = prose.ONE_STEADY_EPOCH if samples == 1 else prose.STEADY_EPOCHS.format(n=samples)
        return prose.SAMPLES_SAME.format(epochs=epochs, trainings=trainings)
    return prose.SAMPLES_VARY


def _details_table(
    rows: list[Row], speedups: dict[str, float | None], spec: ReportSpec
) -> list[str]:
    """Every trained variant's figures (a skipped one is in the answer's table, with why),
    without the columns no variant has a figure in."""
    table = [_details_cells(r, speedups, spec) for r in rows if isinstance(r.train, TrainSummary)]
    if not table:
        return []
    head = _columns(prose.DETAILS_COLUMNS, spec)
    shown = [i for i in range(len(head)) if any(cells[i] != "n/a" for cells in table)]
    return prose.table([head[i] for i in shown], ([cells[i] for i in shown] for cells in table))


def _details_cells(row: Row, speedups: dict[str, float | None], spec: ReportSpec) -> list[str]:
    t = row.train
    reached = time_to_target(row.epochs, spec.target_accuracy)
    cache = f" ({t.compile_cache} compile cache)" if t.compile_cache else ""
    return [
        row.name,
        "trained",
        t.device_name,
        _precision_mode(row.variant),
        row.variant.batches,
        str(t.epochs),
        _cell(t.first_epoch_s, "s") + cache,
        f"{_cell(t.steady_epoch_s, 's')}; {len(row.steady_samples)}",
        _cell(t.total_train_s, "s"),
        _cell(t.steady_samples_per_s, "int"),
        _cell(speedups.get(row.name), "x"),
        _cell(t.data_wait_fraction, "pct0"),
        f"{t.steady_tflops:.2f}" + (f" ({t.peak_share:.1%})" if t.peak_share is not None else ""),
        _cell(t.peak_host_rss_mib, "mib"),
        _cell(t.peak_gpu_mem_mib, "mib"),
        _cell(t.steady_gpu_energy_j_per_epoch, "j"),
        _cell(row.test_accuracy, "pct"),
        f"{fmt_seconds(reached[0])} (epoch {reached[1]})" if reached else prose.NOT_REACHED,
    ]


def settings_differing(variant: VariantParams, base: VariantParams) -> list[str]:
    """Settings (other than `distributed`) in which two variants differ."""
    ours, theirs = variant.model_dump(), base.model_dump()
    return [k for k in ours if k != "distributed" and ours[k] != theirs[k]]


def _scaling_lines(rows: list[Row], baselines: Mapping[str, str]) -> list[str]:
    """DDP rows: speedup over their single-process baseline, and scaling efficiency."""
    by_name = {r.name: r for r in rows}
    cells, notes = [], []
    for row in (r for r in rows if r.variant.distributed is not None and r.trained):
        base, t = by_name.get(baselines.get(row.name, "")), row.train
        ratio = speedup(base.train if base else None, t)
        efficiency = _cell(scaling_efficiency(ratio, t.world_size), "pct0")
        against = base.name if base else prose.NO_SCALING_BASELINE
        steady = fmt_seconds(t.steady_epoch_s)
        cells.append([row.name, t.world_size, steady, _cell(ratio, "x"), efficiency, against])
        if base and (differing := settings_differing(row.variant, base.variant)):
            mixed = {"name": row.name, "base": base.name, "settings": ", ".join(differing)}
            notes.append(prose.SCALING_MIXED.format(**mixed))
    if not cells:
        return []
    table = prose.table(_columns(prose.SCALING_COLUMNS), cells)
    return [prose.SCALING, "", *table, "", prose.SCALING_NOTE, *notes, ""]


def _quantized_lines(rows: list[Row]) -> list[str]:
    """Each trained model on the CPU in fp32 and int8: accuracy, latency, throughput, size."""
    measured = [r for r in rows if isinstance(r.quantized, QuantizedSummary)]
    if not measured:
        return []
    q = measured[0].quantized
    head = _columns(prose.QUANTIZED_COLUMNS, batch=q.batch_size)
    table = prose.table(head, (cells for r in measured for cells in _quantized_cells(r)))
    note = prose.QUANTIZED_NOTE.format(q=q)
    return [prose.QUANTIZED, "", *table, "", note, ""]


def _quantized_cells(row: Row) -> Iterator[list[str]]:
    q = row.quantized
    base = q.methods["fp32"]
    for method in QUANT_METHODS:
        if method in q.unsupported:
            why = prose.QUANT_UNSUPPORTED.format(why=q.unsupported[method])
            yield [row.name, prose.QUANT_LABELS[method], why]
        elif (m := q.methods.get(method)) is not None:
            yield [
                row.name,
                prose.QUANT_LABELS[method],
                f"{m.test_accuracy:.2%}",
                f"{100 * (m.test_accuracy - base.test_accuracy):+.2f} pt",
                f"{m.latency_ms:.3f} ms",
                f"{base.latency_ms / m.latency_ms:.2f}×",
                f"{m.samples_per_s:,.0f}",
                f"{m.samples_per_s / base.samples_per_s:.2f}×",
                f"{m.size_bytes / 1024:,.0f} KiB",
                f"{m.size_bytes / base.size_bytes:.2f}×",
            ]


def _costs(row: Row, spec: ReportSpec) -> tuple[RunCost, RunCost | None]:
    """The whole run's cost, and the cost up to the epoch that reached the target (or None)."""
    device, processes = row.variant.device, row.train.world_size
    return costs_to_target(row.epochs, device, processes, spec.cost, spec.target_accuracy)


def _cost_lines(rows: list[Row], spec: ReportSpec) -> list[str]:
    """Energy cost, time cost and their sum per trained variant, for the run and to target."""
    trained = [r for r in rows if r.trained and r.epochs]
    if spec.cost is None or not trained:
        return []
    cells = []
    for row in trained:
        whole, upto = _costs(row, spec)
        usd = map(usd_per_1000, (whole.energy_usd, whole.time_usd, whole.total_usd))
        to_target = usd_per_1000(upto.total_usd) if upto else prose.NOT_REACHED
        wh = f"{whole.energy_j / 3600:,.2f} Wh"
        cells.append([row.name, wh, whole.energy_source, *usd, to_target])
    table = prose.table(_columns(prose.COST_COLUMNS, spec), cells)
    return [prose.COST, "", *table, "", prose.COST_NOTE.format(**spec.cost.model_dump()), ""]


SUMMARY_PNG = "summary.png"


def document(
    rows: list[Row],
    figures: Mapping[str, VariantFigures],
    env: EnvFacts,
    spec: ReportSpec,
    pipeline: PipelineTime | None = None,
) -> str:
    """comparison.md: the answer (headline, table, summary figure), then the details."""
    speedups = {  # each variant's point speedup; one variant: nothing to compare
        n: f.speedup.value if f.speedup else None for n, f in figures.items() if len(figures) > 1
    }
    flops = next((r.train.flops_per_sample for r in rows if r.trained), None)
    dataset = prose.DATASET_TITLES.get(spec.dataset, spec.dataset)
    lines = [
        prose.TITLE,
        "",
        " ".join(answer.headline(rows, figures, env, spec.speedup_baseline, spec.target_accuracy)),
        "",
        *_answer_table(rows, figures, spec),
        "",
        prose.SUMMARY_FIGURE.format(path=SUMMARY_PNG),
        "",
        prose.DETAILS,
        prose.CPU.format(cpu=env.cpu),
        prose.SOFTWARE.format(software=env.cpu.software),
        (prose.GPU if env.cuda.gpu else prose.NO_GPU).format(gpu=env.cuda.gpu, cuda=env.cuda),
        prose.DATASET.format(dataset=dataset),
        prose.RECIPE.format(recipe=spec.recipe),
        "",
        *_details_table(rows, speedups, spec),
        "",
        *_scaling_lines(rows, spec.scaling_baselines),
        *_quantized_lines(rows),
        *_cost_lines(rows, spec),
        prose.PLOTS_POINTER,
        "",
        *([prose.FLOPS.format(mflop=flops / 1e6), ""] if flops else []),
        *(pipeline_time.markdown(pipeline) if pipeline is not None else []),
        *([prose.TUTORIALS] if spec.dataset == "mnist" else []),
    ]
    return "\n".join(lines)


def write_report(
    out_dir: Path,
    rows: list[Row],
    env: EnvFacts,
    spec: ReportSpec,
    pipeline: PipelineTime | None = None,
    outputs: StagedOutputs | None = None,
) -> ReportResult:
    """The report's files in `out_dir`, written through `outputs` (by default, its own
    `staged()`): all new or all old, never in place."""
    if outputs is None:
        with staged() as outputs:
            return write_report(out_dir, rows, env, spec, pipeline, outputs)
    figures = answer.variant_figures(rows, spec.speedup_baseline, spec.target_accuracy)
    gpu = env.cuda.gpu.gpu_names[0] if env.cuda.gpu is not None else ""
    figure = summary_figure(rows, figures, spec.speedup_baseline, gpu)
    figure.savefig(outputs(out_dir / SUMMARY_PNG, FIGURE), dpi=130)
    md = document(rows, figures, env, spec, pipeline)
    outputs(out_dir / "comparison.md", COMPARISON_MD).write_text(md)
    entries = {row.name: _comparison_entry(row, figures.get(row.name), spec) for row in rows}
    # DVC's metrics (`dvc metrics show`): the figures a user compares across variants
    dvc_metrics = {
        name: {
            **(f.compared(spec.speedup_baseline) if (f := figures.get(name)) else {}),
            "test_accuracy": entry.get("test_accuracy"),
        }
        for name, entry in entries.items()
    }
    earlier = reported_variants(out_dir / "comparison.json")
    write_variant_metrics(out_dir / METRICS_DIR, dvc_metrics, outputs, earlier)
    write_json(outputs(out_dir / "comparison.json", COMPARISON_JSON), entries)
    files = [out_dir / "comparison.md", out_dir / SUMMARY_PNG, out_dir / "comparison.json"]
    if pipeline is not None:
        files.append(out_dir / "pipeline_time.json")
        text = json.dumps(pipeline.to_json(), indent=2) + "\n"
        outputs(files[-1], PIPELINE_TIME_JSON).write_text(text)
    pipeline_metrics = {
        f"{name}.{key}": value
        for name, values in entries.items()
        for key, value in values.items()
        if isinstance(value, int | float)
    }
    return ReportResult(files, pipeline_metrics, entries)


def _comparison_entry(row: Row, figures: VariantFigures | None, spec: ReportSpec) -> dict[str, Any]:
    """A variant's entry in comparison.json: its status and, as far as it got, its figures
    (with their 95% intervals where the figures have them)."""
    out: dict[str, Any] = {"status": row.train.status}
    if figures is not None:  # trained, with a steady epoch
        out |= figures.metrics(spec.speedup_baseline)
        out["steady_epoch_samples"] = figures.steady_epoch.samples
    if spec.cost is not None and row.trained and row.epochs:  # at `cost:`'s prices
        whole, upto = _costs(row, spec)
        out |= {
            "cost_usd": whole.total_usd,  # the whole run's training
            "energy_j": whole.energy_j,
            "energy_source": whole.energy_source,  # "measured: " counters, or "estimated: "
            "cost_to_target_usd": upto.total_usd if upto else None,  # None: none reached it
        }
    trained = row.train if isinstance(row.train, TrainSummary) else None
    quantized = row.quantized if isinstance(row.quantized, QuantizedSummary) else None
    given = {
        "reason": row.train.reason if isinstance(row.train, Skipped) else None,
        # nested: the pipeline run's metrics are flat
        "quantized": (quantized.metrics() or None) if quantized else None,
        "quantized_unsupported": (quantized.unsupported or None) if quantized else None,
        "first_epoch_s": trained.first_epoch_s if trained else None,
        "stage_to_model_s": row.stage_to_model_s,
        "repeats": trained.repeats if trained else None,
        "test_accuracy": row.eval.test_accuracy if isinstance(row.eval, EvalSummary) else None,
        "shared_machine": shared_machine(row),  # measured while other work ran on the machine
    }
    return out | {key: value for key, value in given.items() if value is not None}
