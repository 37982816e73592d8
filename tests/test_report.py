from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from accelbench.core.env_facts import CpuFacts, CudaFacts, EnvFacts, GpuFacts, SoftwareFacts
from accelbench.core.params import VariantParams
from accelbench.core.results import EpochRecord, Skipped
from accelbench.report import answer
from accelbench.report import markdown as report
from helpers import REPO, trained_summary

SOFTWARE = SoftwareFacts(python="3.11", torch="2.x", torchvision="0.x")
ENV = EnvFacts(
    CpuFacts(
        cpu_model="Test CPU",
        logical_cpus=2,
        torch_default_threads=2,
        machine="x86_64",
        software=SOFTWARE,
    ),
    CudaFacts(
        torch_cuda_runtime="13.0",
        nvidia_driver="580",
        software=SOFTWARE,
        gpu=GpuFacts(
            gpu_count=2,
            gpu_names=["NVIDIA H200"] * 2,
            compute_capability="9.0",
            gpu_memory_gib=139.8,
            cudnn=91900,
            bf16_supported=True,
        ),
    ),
)
NO_GPU = CudaFacts(None, None, SOFTWARE, reason="no GPU in the test")


def epoch(n: int, train_time_s: float, test_accuracy: float, **fields) -> EpochRecord:
    """An epochs.csv record (energy: not measured unless given)."""
    values = {
        "epoch": n, "train_loss": 0.1 / n, "train_time_s": train_time_s, "data_wait_s": 0.0,
        "samples": 60000, "samples_per_s": 60000 / train_time_s, "test_loss": 0.05,
        "test_accuracy": test_accuracy, "nonfinite_steps": 0, "lr": 1e-3,
        "peak_gpu_mem_mib": None,
    }  # fmt: skip
    return EpochRecord(**(values | fields))


def _spec(**changes) -> report.ReportSpec:
    values = {
        "target_accuracy": 0.99,
        "speedup_baseline": "cpu",
        "scaling_baselines": {"ddp": "gpu", "ddp_bf16": "gpu"},
        "recipe": "batch 512, 10 epochs",
    }
    return report.ReportSpec(**(values | changes))


def test_report_has_speedups_scaling_and_figures(tmp_path) -> None:
    rows = [
        report.Row(
            "cpu", VariantParams(device="cpu"), trained_summary(10.0, device_name="Test CPU")
        ),
        report.Row(
            "gpu",
            VariantParams(device="cuda"),
            trained_summary(0.2, steady_gpu_energy_j_per_epoch=55.0),
        ),
        report.Row(
            "ddp",
            VariantParams(device="cuda", distributed={"nproc_per_node": 2}),
            trained_summary(0.125, world_size=2),
        ),
        report.Row(
            "ddp_bf16",
            VariantParams(device="cuda", precision="bf16", distributed={"nproc_per_node": 2}),
            trained_summary(0.1, world_size=2),
        ),
        report.Row(
            "amp", VariantParams(device="cuda", precision="bf16"), Skipped("no GPU", "cuda")
        ),
    ]
    result = report.write_report(tmp_path, rows, ENV, _spec())
    md = (tmp_path / "comparison.md").read_text()
    assert "| gpu | trained | NVIDIA H200 | fp32 (strict) |" in md
    assert "speedup vs cpu" in md and "50.0×" in md  # 10 s / 0.2 s
    assert "55 J" in md
    assert "| ddp | 2 | 0.125 s | 1.6× | 80% | gpu |" in md  # speedup over gpu, efficiency
    assert "ddp_bf16 differs from gpu in precision: its speedup mixes" in md
    assert "ddp differs" not in md  # same settings as gpu: the ratio is the scaling alone
    assert "Skipped amp: no GPU." in md
    assert "GTX 1080 Ti" in md  # the tutorials' figures
    assert "](summary.png)" in md and (tmp_path / "summary.png").stat().st_size > 10_000
    # every epoch's figures are dvc.yaml's plots: pointed to, not drawn again
    assert [p.name for p in tmp_path.glob("*.png")] == ["summary.png"] and "`make plots`" in md
    headline = json.loads((tmp_path / "comparison.json").read_text())
    assert headline["gpu"]["speedup_vs_cpu"] == 50.0
    assert headline["amp"] == {"status": "skipped", "reason": "no GPU"}  # as the report says
    assert "reason" not in headline["gpu"]
    assert result.pipeline_metrics["ddp.speedup_vs_cpu"] == 80.0


def test_baselines_come_from_params_not_from_variant_names(tmp_path) -> None:
    rows = [
        report.Row("cpu", VariantParams(device="cpu"), trained_summary(10.0)),
        report.Row("fast", VariantParams(device="cuda"), trained_summary(0.5)),
        report.Row(
            "ddp", VariantParams(device="cuda", distributed={"nproc_per_node": 2}),
            trained_summary(0.25, world_size=2),
        ),
    ]  # fmt: skip
    spec = _spec(speedup_baseline="fast", scaling_baselines={"ddp": "fast"})
    result = report.write_report(tmp_path, rows, ENV, spec)
    md = (tmp_path / "comparison.md").read_text()
    assert "speedup vs fast" in md and "| ddp | 2 | 0.250 s | 2.0× | 100% | fast |" in md
    assert result.pipeline_metrics["cpu.speedup_vs_fast"] == 0.05


def test_time_to_target_is_read_from_the_epochs() -> None:
    epochs = [epoch(1, 5.0, 0.9), epoch(2, 1.0, 0.985), epoch(3, 2.0, 0.991), epoch(4, 1.5, 0.99)]
    assert report.time_to_target(epochs, 0.99) == (8.0, 3)
    assert report.time_to_target(epochs[:2], 0.99) is None


def _epochs(*rows: tuple[float, float, float | None]) -> list[EpochRecord]:
    """epochs.csv records: (train_time_s, test_accuracy, gpu_energy_j or None)."""
    return [epoch(i, t, a, gpu_energy_j=e) for i, (t, a, e) in enumerate(rows, start=1)]


def test_cost_table_uses_measured_energy_else_the_stated_wattage(tmp_path) -> None:
    from accelbench.core.params import CostParams

    prices = CostParams(kwh_usd=0.15, cpu_system_w=150, gpu_system_w=450, cpu_hour_usd=0.06,
                        gpu_hour_usd=0.13)  # fmt: skip
    rows = [
        report.Row("cpu", VariantParams(device="cpu"), trained_summary(1800.0),
                   epochs=_epochs((1800.0, 0.98, None), (1800.0, 0.992, None))),
        report.Row("gpu", VariantParams(device="cuda"), trained_summary(36.0),
                   epochs=_epochs((36.0, 0.985, 18_000.0), (36.0, 0.989, 18_000.0))),
    ]  # fmt: skip
    result = report.write_report(tmp_path, rows, ENV, _spec(cost=prices))
    md = (tmp_path / "comparison.md").read_text()
    # cpu: 150 W × 3600 s = 150 Wh = $0.0225, plus one hour at $0.06; to 99%: both epochs;
    # per 1,000 runs
    assert (
        "| cpu | 150.00 Wh | estimated: 150 W (stated) × time | $22.50 | $60.00 | $82.50 | $82.50 |"
        in md
    )
    # gpu: NVML's 36 kJ = 10 Wh = $0.0015, plus 72 s at $0.13/h = $0.0026; 99% not reached
    assert (
        "| gpu | 10.00 Wh | measured: GPU board (NVML) | $1.50 | $2.60 | $4.10 | not reached |"
        in md
    )
    assert "| $82.50 |" in md.split("## Details")[0]  # the answer's table: per 1,000 runs
    headline = json.loads((tmp_path / "comparison.json").read_text())
    assert headline["cpu"]["cost_usd"] == headline["cpu"]["cost_to_target_usd"]
    assert headline["gpu"]["cost_to_target_usd"] is None
    assert result.pipeline_metrics["gpu.energy_j"] == 36_000.0


def test_the_cost_to_target_stops_at_the_first_epoch_that_reached_it() -> None:
    from accelbench.core.params import CostParams
    from accelbench.report.costs import costs_to_target

    epochs = _epochs((10.0, 0.98, None), (10.0, 0.991, None), (10.0, 0.992, None))
    whole, upto = costs_to_target(epochs, "cpu", 1, CostParams(), 0.99)
    assert (whole.train_s, upto.train_s) == (30.0, 20.0)
    assert costs_to_target(epochs, "cpu", 1, CostParams(), 0.995)[1] is None


def test_cost_of_a_ddp_run_pays_every_gpu_and_the_cpu_counter_counts(tmp_path) -> None:
    from accelbench.core.params import CostParams
    from accelbench.report.costs import run_cost

    epochs = [epoch(1, 3600.0, 0.99, cpu_energy_j=7200.0)]  # no GPU counter read
    ddp = run_cost(epochs, "cuda", 2, CostParams())
    assert ddp.energy_source == "measured: CPU packages (RAPL)" and ddp.energy_j == 7200.0
    assert ddp.time_usd == 2 * CostParams().gpu_hour_usd
    stated = run_cost([epoch(1, 3600.0, 0.99)], "cuda", 2, CostParams(kwh_usd=1.0))
    assert stated.energy_source == "estimated: 2 × 450 W (stated) × time"
    assert stated.energy_usd == 0.9  # 900 W for an hour at $1/kWh


def test_a_gpu_counter_that_read_0_j_every_steady_epoch_is_costed_at_the_stated_wattage() -> None:
    """amp's 0.07 s epochs on an H200 read 0 J: NVML's counter had not advanced within any
    (docs/results/h200-time-to-result-3.md). Summed, they cost 1 epoch of energy as measured;
    train.json says no steady energy was measured, and so must the cost."""
    from accelbench.core.params import CostParams
    from accelbench.report.costs import run_cost

    run = _epochs(*[(20.0, 0.9, 2808.8)] + [(0.07, 0.99, 0.0)] * 9)
    whole = run_cost(run, "cuda", 1, CostParams())
    assert whole.energy_source == "estimated: 450 W (stated) × time"
    assert whole.energy_j == pytest.approx(450 * (20.0 + 9 * 0.07))
    upto = run_cost(run[:1], "cuda", 1, CostParams(), run=run)  # 99% at epoch 1: the run decides
    assert upto.energy_source == "estimated: 450 W (stated) × time"
    # killed after epoch 3 and resumed: the resume's long warm-up read energy, no steady epoch did
    resumed = _epochs(*[(20.0, 0.9, 2808.8)] + [(0.07, 0.99, 0.0)] * 2 + [(19.0, 0.99, 2600.0)]
                      + [(0.07, 0.99, 0.0)] * 2)  # fmt: skip
    resumed[3] = replace(resumed[3], warm_up=True)
    assert (
        run_cost(resumed, "cuda", 1, CostParams()).energy_source
        == "estimated: 450 W (stated) × time"
    )
    from accelbench.training.engine import summarize

    assert summarize(resumed).steady_gpu_energy_j_per_epoch is None
    steps = _epochs((20.0, 0.9, 2808.8), (0.13, 0.99, 0.0), (0.13, 0.99, 83.0))  # a coarse counter
    assert run_cost(steps, "cuda", 1, CostParams()).energy_j == pytest.approx(2891.8)


def test_time_to_target_after_a_resume_redraws_only_steady_epochs() -> None:
    """A training killed after epoch 3 and resumed compiled again in epoch 4: that epoch is
    measured once, as the first is, and never drawn as a steady one."""
    epochs = [epoch(1, 5.0, 0.9, warm_up=True), epoch(2, 1.0, 0.95), epoch(3, 1.0, 0.97),
              epoch(4, 9.0, 0.98, warm_up=True), epoch(5, 1.0, 0.985), epoch(6, 1.0, 0.991)]  # fmt: skip
    rows = [report.Row("gpu", VariantParams(device="cuda"), trained_summary(1.0), epochs=epochs)]
    figures = answer.variant_figures(rows, "gpu", 0.99)["gpu"]
    assert (figures.to_target.value, figures.to_target.lo, figures.to_target.hi) == (18, 18, 18)
    assert figures.target_epoch == 6


def test_quantized_table_compares_each_method_with_fp32(tmp_path) -> None:
    from accelbench.core.results import InferenceFigures, QuantizedSummary

    quantized = QuantizedSummary(
        threads=2, batch_size=2048, latency_repeats=100,
        methods={"fp32": InferenceFigures("fp32", 0.99, 1.0, 10_000, 400 * 1024),
                 "dynamic_int8": InferenceFigures("dynamic_int8", 0.9899, 0.8, 12_500, 100 * 1024)},
        unsupported={"static_int8": "no x86 engine"},
    )  # fmt: skip
    row = report.Row("cpu", VariantParams(device="cpu"), trained_summary(10.0))
    row.quantized = quantized
    report.write_report(tmp_path, [row], ENV, _spec())
    md = (tmp_path / "comparison.md").read_text()
    assert "## Quantized inference on the CPU" in md and "samples/s, batch 2048" in md
    assert (
        "| cpu | fp32 | 99.00% | +0.00 pt | 1.000 ms | 1.00× | 10,000 | 1.00× | 400 KiB | 1.00× |"
        in md
    )
    assert (
        "| cpu | dynamic int8 (Linear layers) | 98.99% | -0.01 pt | 0.800 ms | 1.25× | 12,500 | 1.25× | 100 KiB | 0.25× |"
        in md
    )
    assert "| cpu | static int8 (x86 backend) | not supported: no x86 engine |" in md
    figures = json.loads((tmp_path / "comparison.json").read_text())["cpu"]["quantized"]
    assert figures == quantized.metrics() and figures["quant_dynamic_int8_latency_ms"] == 0.8
    entry = json.loads((tmp_path / "comparison.json").read_text())["cpu"]
    assert entry["quantized_unsupported"] == {"static_int8": "no x86 engine"}


def test_a_single_epoch_run_has_no_steady_figures_and_still_reports(tmp_path) -> None:
    """epochs: 1 gives no steady epoch: the row says so instead of failing compare."""
    row = report.Row("cpu", VariantParams(device="cpu"), replace(trained_summary(1.0),
                     epochs=1, steady_epoch_s=None, steady_epochs_s=[]))  # fmt: skip
    report.write_report(tmp_path, [row], ENV, _spec())
    md = (tmp_path / "comparison.md").read_text()
    assert "no variant has a steady epoch (none trained two epochs or more" in md
    assert "| cpu | cpu, fp32 | one epoch: no steady | — | — | 99.00% | — |" in md  # tested
    # two epochs, resumed after the first: each warmed up, neither is steady
    resumed = replace(row, train=replace(row.train, epochs=2))
    report.write_report(tmp_path, [resumed], ENV, _spec())
    md = (tmp_path / "comparison.md").read_text()
    assert "| cpu | cpu, fp32 | no steady epoch (resumed or stopped) |" in md


def test_a_cpu_only_report_ranks_nothing_and_says_each_skip_reason_once(tmp_path) -> None:
    """A machine without a GPU, as a new user's: one variant trained, three skipped for two
    reasons. No speedups of one variant, each reason once, no all-n/a columns, a pointer to a
    GPU's figures, and the stated-watts energy called an estimate."""
    from accelbench.core.params import CostParams

    no_gpu = "needs CUDA but no NVIDIA driver found"
    cpu = trained_summary(122.0, device="cpu", device_name="Test CPU")
    rows = [
        report.Row("cpu", VariantParams(device="cpu"), cpu,
                   epochs=_epochs((130.0, 0.98, None), (122.0, 0.985, None), (122.0, 0.989, None))),
        *[report.Row(n, VariantParams(device="cuda"), Skipped(no_gpu, "cuda")) for n in ("gpu", "amp")],
        report.Row("ddp", VariantParams(device="cuda", distributed={"nproc_per_node": 2}),
                   Skipped("asks for 2 GPUs per node", "cuda")),
    ]  # fmt: skip
    report.write_report(tmp_path, rows, replace(ENV, cuda=NO_GPU), _spec(cost=CostParams()))
    md = (tmp_path / "comparison.md").read_text()
    answer_part, details = md.split("## Details")
    assert "speedup vs" not in md and "trains fastest" not in md
    assert "| gpu | cuda, fp32 | skipped | — |" in answer_part
    assert md.count(no_gpu) == 1 and f"Skipped gpu, amp: {no_gpu}." in answer_part
    assert md.count("asks for 2 GPUs per node") == 1
    # the page the README's Result links to, whose figures it shows
    result = (REPO / "README.md").read_text().split("## Result")[1].split("\n## ")[0]
    page = re.search(r"\((docs/results/[^)]+\.md)\)", result).group(1)
    assert f"({page})" in answer_part and (REPO / page).is_file()
    table = [line for line in details.splitlines() if line.startswith("| cpu | trained")]
    assert len(table) == 1 and "n/a" not in table[0] and "| gpu |" not in details
    assert "estimated: 150 W (stated) × time" in md
    entry = json.loads((tmp_path / "comparison.json").read_text())["cpu"]
    assert entry["energy_source"] == "estimated: 150 W (stated) × time"


def test_the_summary_figure_fits_its_axis_to_the_data_and_says_when_there_is_none() -> None:
    """A CPU-only run's one 122 s bar on a linear axis ending near it, two variants decades
    apart on a log axis; with no steady epoch (one epoch trained) the figure was an empty log
    axis from 0.005 s to 8 s with a y-axis of -0.04 to 0.04: it says why there is nothing. The
    accuracy axis ends near the best accuracy, not at 100% whatever it was."""
    from accelbench.report.summary_figure import NOTHING, summary_figure

    cpu = report.Row("cpu", VariantParams(device="cpu"), trained_summary(122.0))
    fig = summary_figure([cpu], answer.variant_figures([cpu], "cpu", 0.99), "cpu", "")
    time_ax = fig.axes[0]
    assert time_ax.get_xscale() == "linear" and 122 < time_ax.get_xlim()[1] < 2 * 122
    gpu = report.Row("gpu", VariantParams(device="cuda"), trained_summary(0.1))
    both = summary_figure([cpu, gpu], answer.variant_figures([cpu, gpu], "cpu", 0.99), "cpu", "")
    assert both.axes[0].get_xscale() == "log"
    one = replace(cpu, train=replace(cpu.train, epochs=1, steady_epoch_s=None, steady_epochs_s=[]))
    empty = summary_figure([one], answer.variant_figures([one], "cpu", 0.99), "cpu", "")
    assert empty.axes == [] and [t.get_text() for t in empty.texts] == [NOTHING]
    # a smoke run's 53.5% beside an axis to 100%: a sliver of a bar
    weak = replace(cpu, train=replace(cpu.train, final_test_accuracy=0.5352))
    fig = summary_figure([weak], answer.variant_figures([weak], "cpu", 0.99), "cpu", "")
    assert 52 < fig.axes[1].get_xlim()[0] < 53.52 < fig.axes[1].get_xlim()[1] < 56
