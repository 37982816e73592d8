"""The answer: intervals that carry the spread, and a headline that names who is fastest."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
from dataclasses import replace

import pytest

from accelbench.core import spread
from accelbench.core.params import VariantParams
from accelbench.core.results import EpochRecord, Skipped, TrainResult, read, read_epoch_records
from accelbench.report.answer import (
    Row,
    break_even,
    fastest,
    first_to_target,
    fmt_speedup,
    fp32_twins,
    headline,
    uncompiled_twins,
    variant_figures,
)
from helpers import train_command, trained_summary, write_params
from test_report import ENV, epoch

GPU = VariantParams(device="cuda", precision="fp32", compile="default", cuda_graph=True)
AMP = GPU.model_copy(update={"precision": "bf16"})


def _epochs(first: float, steady: float, jitter: float, seed: int) -> list[EpochRecord]:
    rng = random.Random(seed)
    accuracy = [0.97, 0.985, 0.99, 0.991, 0.992]
    return [
        epoch(i + 1, first if i == 0 else steady * (1 + jitter * (rng.random() - 0.5)), a)
        for i, a in enumerate(accuracy)
    ]


def _row(name: str, variant: VariantParams, first: float, steady: float, seed: int = 0) -> Row:
    epochs = _epochs(first, steady, 0.2, seed)
    summary = replace(
        trained_summary(steady),
        first_epoch_s=first,
        steady_epochs_s=[e.train_time_s for e in epochs[1:]],
    )
    return Row(name, variant, summary, None, epochs)


def test_median_interval_holds_the_median_and_narrows_with_samples() -> None:
    rng = random.Random(1)
    few = [10 + rng.gauss(0, 1) for _ in range(5)]
    many = [10 + rng.gauss(0, 1) for _ in range(200)]
    small, large = spread.median(few), spread.median(many)
    assert small.value == statistics.median(few)
    assert small.lo <= small.value <= small.hi
    assert (large.hi - large.lo) < (small.hi - small.lo)
    assert spread.median(few) == small  # a fixed seed: the same epochs, the same interval
    assert spread.median([3.0]) == spread.Figure(3.0)  # one sample: no interval
    assert spread.median([]) is None


def test_ratio_interval_carries_both_spreads() -> None:
    rng = random.Random(2)
    slow = [10 * (1 + rng.uniform(-0.2, 0.2)) for _ in range(9)]
    steady = [0.1 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(9)]
    noisy = [0.1 * (1 + rng.uniform(-0.2, 0.2)) for _ in range(9)]
    tight, wide = spread.ratio_of_medians(slow, steady), spread.ratio_of_medians(slow, noisy)
    assert tight.value == pytest.approx(statistics.median(slow) / statistics.median(steady))
    assert tight.lo < tight.value < tight.hi
    # the noisier denominator widens the ratio's interval beyond the numerator's alone
    assert (wide.hi - wide.lo) / wide.value > (tight.hi - tight.lo) / tight.value
    assert spread.ratio_of_medians([4.0], [2.0]) == spread.Figure(2.0)


def test_rate_interval_is_the_time_interval_inverted() -> None:
    time = spread.Figure(2.0, 1.0, 4.0, 9)
    assert time.inverse(100) == spread.Figure(50.0, 25.0, 100.0, 9)


def test_time_to_target_redraws_the_epochs_after_the_first() -> None:
    total = spread.total_after(5.0, [0.5, 1.0, 1.5])
    assert total.value == 8.0
    assert 6.5 <= total.lo < total.value < total.hi <= 9.5  # first epoch fixed at 5 s
    assert spread.total_after(5.0, []) == spread.Figure(5.0)
    assert spread.total_after(5.0, [1.0]) == spread.Figure(6.0)  # one epoch: no interval


def test_mixed_precision_is_compared_with_its_fp32_twin_only() -> None:
    rows = [
        Row("cpu", VariantParams(device="cpu"), trained_summary(10.0)),
        Row("gpu", GPU, trained_summary(0.1)),
        Row("amp", AMP, trained_summary(0.05)),
        Row("loader", VariantParams(device="cuda", precision="fp16", batches="dataloader"),
            trained_summary(1.0)),
    ]  # fmt: skip
    assert fp32_twins(rows) == {"amp": "gpu"}


def test_headline_names_the_fastest_its_speedup_and_what_precision_alone_buys() -> None:
    rows = [
        _row("cpu", VariantParams(device="cpu"), 11.0, 10.0, 1),
        _row("gpu", GPU, 15.0, 0.128, 2),
        _row("amp", AMP, 16.0, 0.069, 3),
        Row("ddp", GPU, Skipped("needs 2 GPUs", "cuda")),
    ]
    figures = variant_figures(rows, "cpu", 0.99)
    assert set(figures) == {"cpu", "gpu", "amp"}
    amp = figures["amp"]
    assert amp.speedup.lo < amp.speedup.value < amp.speedup.hi
    assert amp.fp32_twin == "gpu" and amp.over_fp32.value == pytest.approx(
        statistics.median(rows[1].steady_samples) / statistics.median(rows[2].steady_samples)
    )
    assert figures["cpu"].speedup == spread.Figure(1.0)  # the baseline: no interval to draw
    assert amp.target_epoch == 3 and amp.to_target.value == pytest.approx(
        sum(e.train_time_s for e in rows[2].epochs[:3])
    )
    text = " ".join(headline(rows, figures, ENV, "cpu", 0.99))
    assert text.startswith("On NVIDIA H200 and Test CPU (2 threads), torch 2.x: **amp**")
    assert f"**{fmt_speedup(amp.speedup)}** faster than cpu" in text
    assert "Mixed precision alone (amp's bf16 over gpu's fp32" in text
    assert "To 99.0% test accuracy, cpu is first" not in text
    assert "skipped on this machine: ddp" in text
    metrics = amp.metrics("cpu")
    assert metrics["speedup_vs_cpu_lo"] == amp.speedup.lo
    assert metrics["speedup_vs_fp32_hi"] == amp.over_fp32.hi


def test_repeats_join_the_steady_samples() -> None:
    row = _row("cpu", VariantParams(device="cpu"), 11.0, 10.0)
    pooled = replace(row.train, steady_epochs_s=row.steady_samples * 3, repeats=3)
    figures = variant_figures([replace(row, train=pooled)], None, 0.99)
    assert figures["cpu"].steady_epoch.samples == 12


def test_headline_without_a_trained_variant_says_why() -> None:
    rows = [Row("gpu", GPU, Skipped("no GPU", "cuda"))]
    (text,) = headline(rows, {}, ENV, "cpu", 0.99)
    assert "no variant has a steady epoch" in text and "skipped: gpu" in text


def test_headline_of_a_machine_without_a_gpu_says_only_the_cpu_trained() -> None:
    rows = [
        _row("cpu", VariantParams(device="cpu"), 11.0, 10.0),
        Row("gpu", GPU, Skipped("no GPU")),
    ]
    text = " ".join(headline(rows, variant_figures(rows, "cpu", 0.99), ENV, "cpu", 0.99))
    assert "**cpu** (cpu, fp32) is the only variant trained here" in text
    assert "faster than" not in text and "skipped on this machine: gpu" in text


def test_headline_names_a_cpu_variants_own_precision() -> None:
    """docs/pipeline.md's cpu_bf16 (bf16 on the CPU, default threads) was headlined
    "**cpu_bf16** (cpu, fp32)": a CPU variant without `threads` was written as fp32."""
    bf16 = VariantParams(device="cpu", precision="bf16", channels_last=True)
    rows = [
        _row("cpu", VariantParams(device="cpu", channels_last=True), 11.0, 10.0, 1),
        _row("cpu_bf16", bf16, 6.0, 5.0, 2),
        _row("cpu_bf16_t2", bf16.model_copy(update={"threads": 2}), 8.0, 7.0, 3),
    ]
    text = " ".join(headline(rows, variant_figures(rows, "cpu", 0.99), ENV, "cpu", 0.99))
    assert "**cpu_bf16** (cpu, bf16) trains fastest" in text
    assert "Mixed precision alone (cpu_bf16's bf16 over cpu's fp32" in text
    rows.reverse()  # the one with threads fastest
    rows[0] = _row("cpu_bf16_t2", bf16.model_copy(update={"threads": 2}), 4.0, 3.0, 3)
    text = " ".join(headline(rows, variant_figures(rows, "cpu", 0.99), ENV, "cpu", 0.99))
    assert "**cpu_bf16_t2** (cpu, bf16, 2 threads) trains fastest" in text


def test_headline_says_why_there_are_no_speedups_when_the_baseline_did_not_train() -> None:
    """report.speedup_baseline: gpu on a machine without one gave a speedup column of n/a in
    every row, and nothing said why."""
    rows = [
        _row("cpu", VariantParams(device="cpu"), 11.0, 10.0),
        Row("gpu", GPU, Skipped("needs CUDA but no NVIDIA driver found", "cuda")),
    ]
    text = " ".join(headline(rows, variant_figures(rows, "gpu", 0.99), ENV, "gpu", 0.99))
    assert (
        "No speedups: their baseline, gpu, was skipped on this machine (needs CUDA but no "
        "NVIDIA driver found); report.speedup_baseline in params.yaml names it." in text
    )
    with_cpu = " ".join(headline(rows, variant_figures(rows, "cpu", 0.99), ENV, "cpu", 0.99))
    assert "No speedups" not in with_cpu


def test_dvc_metrics_and_the_mlflow_tags_are_figures_of_comparison_json(tmp_path) -> None:
    """DVC's metrics pick figures comparison.json has (same names, same values), and each
    MLflow tag names a figure the report writes and reads as the report writes it."""
    from accelbench.report import markdown
    from accelbench.system.tracking.logs import FIGURE_TAGS, figure_text

    rows = [
        _row("cpu", VariantParams(device="cpu"), 11.0, 10.0, 1),
        _row("gpu", GPU, 15.0, 0.128, 2),
        _row("amp", AMP, 16.0, 0.069, 3),
        Row("ddp", GPU, Skipped("needs 2 GPUs", "cuda")),
    ]
    spec = markdown.ReportSpec(0.99, "cpu", {}, "batch 512")
    markdown.write_report(tmp_path, rows, ENV, spec)
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    md = (tmp_path / "comparison.md").read_text()
    for name, figures in comparison.items():
        metrics = json.loads((tmp_path / markdown.METRICS_DIR / f"{name}.json").read_text())
        assert metrics.items() <= figures.items(), name
    assert set(json.loads((tmp_path / markdown.METRICS_DIR / "amp.json").read_text())) == {
        "steady_epoch_s", "steady_epoch_s_lo", "steady_epoch_s_hi", "speedup_vs_cpu",
        "speedup_vs_cpu_lo", "speedup_vs_cpu_hi", "speedup_vs_fp32", "speedup_vs_fp32_lo",
        "speedup_vs_fp32_hi", "time_to_target_s",
    }  # fmt: skip
    assert comparison["ddp"] == {"status": "skipped", "reason": "needs 2 GPUs"}
    for tag, (figure, fmt) in FIGURE_TAGS.items():
        text = figure_text(comparison["amp"], figure, fmt)
        assert text is not None and text in md, tag


def test_the_shared_machine_note_names_training_and_inference() -> None:
    from accelbench.core.results import EvalSummary
    from accelbench.report.answer import shared_machine, shared_notes

    row = _row("gpu", GPU, 3.0, 0.13)
    assert shared_machine(row) is None and shared_notes([row]) == []
    evaluated = EvalSummary(0.99, 0.03, 0.99, 1e6, {}, shared_machine="train@amp on GPU 0")
    inference_only = replace(row, eval=evaluated)
    assert shared_machine(inference_only) == "inference: train@amp on GPU 0"
    both = replace(inference_only, train=replace(row.train, shared_machine="train@cpu on the CPU"))
    assert shared_machine(both) == ("training: train@cpu on the CPU; inference: train@amp on GPU 0")
    assert shared_notes([both])[1] == f"- gpu: {shared_machine(both)}."
    trained_only = replace(row, train=both.train)
    assert shared_machine(trained_only) == "train@cpu on the CPU"  # as train.json says it


def test_an_epoch_its_process_was_stopped_in_is_named_and_in_no_steady_figure() -> None:
    """SIGSTOP for 30 s during epoch 2 of 3: the report said "20.7 s (6.576–34.8 s) a steady
    epoch", and nothing named the pause."""
    from accelbench.report.answer import shared_notes

    stopped = epoch(2, 34.8, 0.98, stopped_s=30.1)
    epochs = [epoch(1, 9.0, 0.97), stopped, epoch(3, 6.576, 0.99)]
    row = Row("cpu", VariantParams(device="cpu"), trained_summary(6.576), None, epochs)
    figures = variant_figures([row], None, 0.99)["cpu"]
    assert figures.steady_epoch.value == 6.576
    assert figures.to_target.value == pytest.approx(9.0 + 34.8 - 30.1 + 6.576)  # run, not stop
    assert shared_notes([row]) == [
        "- cpu epoch 2 was stopped for 30.1 s (SIGSTOP, a suspend or no CPU): left out of the "
        "steady figures."
    ]
    briefly = replace(row, epochs=[epochs[0], replace(stopped, stopped_s=0.3), epochs[2]])
    assert shared_notes([briefly]) == []  # 0.3 s of 34.8 s: under both limits, a steady epoch


def test_an_interval_narrower_than_the_last_digit_is_left_out() -> None:
    """A time to target 19.3 s of first epoch and two 0.07 s epochs read "19.5 s (19.5–19.5
    s)" in `accelbench runs` and the report."""
    from accelbench.core.progress import fmt_interval, fmt_seconds

    assert fmt_interval(19.47, 19.46, 19.48, fmt_seconds) == "19.5 s"
    assert fmt_interval(0.129, 0.127, 0.131, fmt_seconds) == "0.129 s (0.127–0.131 s)"


AMP_UNCOMPILED = AMP.model_copy(update={"compile": "none"})


def test_a_compiled_variant_is_paired_with_its_uncompiled_twin_only() -> None:
    rows = [
        Row("cpu", VariantParams(device="cpu"), trained_summary(10.0)),
        Row("gpu", GPU, trained_summary(0.1)),
        Row("amp", AMP.model_copy(update={"cudnn_benchmark": True}), trained_summary(0.07)),
        Row("amp_uncompiled", AMP_UNCOMPILED, trained_summary(0.14)),
        Row("amp_eager", AMP_UNCOMPILED.model_copy(update={"cuda_graph": False}),
            trained_summary(0.3)),
    ]  # fmt: skip
    # autotuning (cudnn.benchmark) is set-up like compiling; the CUDA graph is not
    assert uncompiled_twins(rows) == {"amp": "amp_uncompiled"}


def _run(first: float, steady: float, epochs: int) -> list[EpochRecord]:
    return [epoch(i + 1, first if i == 0 else steady, 0.99) for i in range(epochs)]


def test_break_even_is_read_from_the_epochs_where_the_run_shows_it() -> None:
    # 2 s of compiling, 0.5 s saved an epoch: level after epoch 5 (2.1 + 4 x 0.5 = 1.1 + 4 x 1)
    even = break_even(_run(2.1, 0.5, 10), _run(0.1, 1.0, 10), 0.5)
    assert (even.epochs, even.observed) == (5, True)
    assert break_even(_run(0.1, 0.5, 3), _run(0.2, 1.0, 3), 0.5).epochs == 1  # no cost at all


def test_break_even_beyond_the_run_is_worked_out_from_its_measured_epochs() -> None:
    # the shipped amp against its twin on an H200: 18 s of compiling, 0.07 s saved an epoch
    even = break_even(_run(18.6, 0.069, 10), _run(0.57, 0.141, 10), 0.141 - 0.069)
    assert not even.observed and even.epochs == 1 + 251  # ceil(18.03 / 0.072)
    never = break_even(_run(5.0, 0.2, 10), _run(0.5, 0.1, 10), -0.1)
    assert never.epochs is None and not never.observed


def test_headline_says_when_compiling_pays_and_who_reaches_the_target_first() -> None:
    rows = [
        _row("cpu", VariantParams(device="cpu"), 11.0, 10.0, 1),
        _row("amp", AMP, 18.6, 0.069, 2),
        _row("amp_uncompiled", AMP_UNCOMPILED, 0.57, 0.141, 3),
    ]
    rows[1].train = replace(rows[1].train, compile_cache="cold")
    rows[2].stage_to_model_s = 9.4
    figures = variant_figures(rows, "cpu", 0.99)
    assert figures["amp"].uncompiled_twin == "amp_uncompiled"
    assert figures["amp"].metrics("cpu")["break_even_epochs"] == figures["amp"].break_even.epochs
    text = " ".join(headline(rows, figures, ENV, "cpu", 0.99))
    assert text.startswith("On NVIDIA H200 and Test CPU (2 threads), torch 2.x: **amp**")
    assert "end to end, **amp_uncompiled** is first" in text
    assert "its first epoch's warm-up included; its train stage 9.400 s from process start" in text
    assert "Compiling pays for itself, against the same settings uncompiled, for amp (" in text
    assert f"after {figures['amp'].break_even.epochs} epochs." in text


def test_the_fastest_and_the_first_to_the_target_are_read_from_the_figures() -> None:
    """The headline's choices, apart from its wording: the shortest steady epoch, the least
    training to the target (a compiled variant's first epoch counts against it)."""
    rows = [
        _row("cpu", VariantParams(device="cpu"), 11.0, 10.0, 1),
        _row("amp", AMP, 18.6, 0.069, 2),
        _row("amp_uncompiled", AMP_UNCOMPILED, 0.57, 0.141, 3),
    ]
    figures = variant_figures(rows, "cpu", 0.99)
    assert fastest(figures) == "amp" and first_to_target(figures) == "amp_uncompiled"
    assert first_to_target(variant_figures(rows, "cpu", 0.999)) is None  # none reached it


def test_a_cpu_only_report_speaks_of_no_compiling_and_ranks_no_one() -> None:
    rows = [
        _row("cpu", VariantParams(device="cpu"), 11.0, 10.0, 1),
        Row("amp", AMP, Skipped("no CUDA GPU", "cuda")),
    ]
    text = " ".join(headline(rows, variant_figures(rows, "cpu", 0.99), ENV, "cpu", 0.99))
    assert "compil" not in text.lower() and " is first" not in text
    assert "To 99.0% test accuracy, cpu took: " in text


def test_time_to_target_and_accuracy_over_seeds_come_from_the_repeats() -> None:
    row = _row("amp_uncompiled", AMP_UNCOMPILED, 0.6, 0.14, 1)  # reaches 99% at epoch 3
    repeats = [
        [[0.2, 0.97], [0.15, 0.991], [0.15, 0.992]],  # epoch 2: its first epoch is the run's
        [[0.2, 0.97], [0.15, 0.98], [0.15, 0.985]],  # never
    ]
    row.train = replace(row.train, repeats=3, repeat_epochs=repeats)
    # the stage's timed epochs, for where the pipeline's time goes: every seed's
    assert row.train.timed_s == pytest.approx(row.train.total_train_s + 1.0)
    figures = variant_figures([row], None, 0.99)
    spread = figures["amp_uncompiled"].seeds
    run_to_target = figures["amp_uncompiled"].to_target.value
    assert spread.count == 3 and spread.to_target_s == [pytest.approx(run_to_target), 0.75]
    assert spread.final_accuracy == [0.992, 0.992, 0.985]
    said = f"2/3 seeds: 0.750–{run_to_target:.3f} s, final 98.50%–99.20%"
    assert spread.text() == said
    assert f"; {said})" in " ".join(headline([row], figures, ENV, None, 0.99))
    assert figures["amp_uncompiled"].metrics(None)["seeds_reached"] == 2
    one = variant_figures([_row("cpu", VariantParams(device="cpu"), 11.0, 10.0)], None, 0.99)
    assert one["cpu"].seeds is None  # one seed: no spread to give


@pytest.mark.slow
def test_each_repeat_trains_at_the_next_seed(tmp_path, prepared, mlflow_store) -> None:
    variants = {"cpu": {"device": "cpu", "threads": 1}, "one": {"device": "cpu", "threads": 1,
                "repeats": 1}}  # fmt: skip
    params = write_params(tmp_path, variants, epochs=2, repeats=2, batch_size=128)
    trained = {}
    for name in variants:
        metrics = tmp_path / name
        command = train_command(params, name, prepared, tmp_path / f"{name}.pt", metrics)
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        trained[name] = read(TrainResult, metrics / "train.json")
    run = [e.test_accuracy for e in read_epoch_records(tmp_path / "cpu" / "epochs.csv")]
    (repeat,) = trained["cpu"].repeat_epochs
    assert trained["cpu"].repeats == 2 and len(repeat) == 2
    assert [accuracy for _, accuracy in repeat] != run  # another seed: other weights, order
    timing = json.loads((tmp_path / ".accelbench" / "timings" / "train@cpu.json").read_text())
    seeds_s = trained["cpu"].total_train_s + sum(seconds for seconds, _ in repeat)
    assert timing["training_s"] == pytest.approx(seeds_s)  # the repeat's epochs are timed too
    assert trained["one"].repeats == 1 and trained["one"].repeat_epochs == []
