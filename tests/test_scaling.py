"""benchmarks/scaling.py: baselines first, DDP rows set against them, one table per run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from helpers import REPO, repo_params_raw


@pytest.mark.slow
def test_scaling_benchmark_sets_ddp_against_its_baseline(tmp_path, prepared, mlflow_store) -> None:
    """Strong scaling splits each batch size over the processes; weak scaling gives each
    process the batch size, and sets that run against the baseline trained at it (once)."""
    variants = {
        "ddp2": {"device": "cpu", "threads": 1, "distributed": {"nproc_per_node": 2}},
        "single": {"device": "cpu", "threads": 1},
    }
    # 4 epochs, one seed: 3 steady epochs a run, enough for the intervals
    raw = repo_params_raw(variants, epochs=4, shift_px=0, schedule="constant")
    raw["report"] = {"scaling_baselines": {"ddp2": "single"}}
    candidates = tmp_path / "candidates.yaml"
    candidates.write_text(yaml.safe_dump(raw))
    out = tmp_path / "scaling"
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "scaling.py"), "--candidates", str(candidates),
         "--batch-sizes", "64", "128", "--scaling", "strong", "weak", "--data", str(prepared),
         "--out", str(out), "--only", "single", "ddp2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = json.loads((out / "scaling.json").read_text())
    assert [(r["scaling"], r["batch_size"], r["per_gpu_batch"], r["variant"]) for r in rows] == [
        ("strong", 64, 64, "single"), ("strong", 64, 32, "ddp2"),
        ("weak", 64, 64, "single"), ("weak", 128, 64, "ddp2"),
        ("strong", 128, 128, "single"), ("strong", 128, 64, "ddp2"),
        ("weak", 128, 128, "single"), ("weak", 256, 128, "ddp2"),
    ]  # fmt: skip
    for single, ddp in zip(rows[0::2], rows[1::2], strict=True):
        assert ddp["world_size"] == 2 and "speedup" not in single
        assert ddp["speedup"] == single["steady_epoch_s"] / ddp["steady_epoch_s"]
        assert ddp["efficiency"] == ddp["speedup"] / 2
    # intervals from the steady epochs, around each figure
    for ddp in rows[1::2]:
        assert ddp["speedup_lo"] <= ddp["speedup"] <= ddp["speedup_hi"]
        assert ddp["efficiency_lo"] == ddp["speedup_lo"] / 2
    # the bound needs the baseline at the per-GPU batch: single at 64 for ddp2 at a global 128
    assert "bound" not in rows[1] and "bound" not in rows[3] and "bound" not in rows[7]
    assert rows[5]["bound"] == pytest.approx(rows[4]["steady_epoch_s"] / rows[0]["steady_epoch_s"])
    assert rows[5]["bound_lo"] <= rows[5]["bound"] <= rows[5]["bound_hi"]
    # a run that serves both scalings is made once: single at 64, ddp2 at a global 128
    assert rows[2] == rows[0] | {"scaling": "weak"}
    assert rows[5]["steady_epoch_s"] == rows[3]["steady_epoch_s"]  # set against single at 128
    assert rows[5]["speedup"] != rows[3]["speedup"]  # ... and at 64
    assert not (out / "batch128" / "metrics" / "ddp2").exists()
    table = (out / "scaling.md").read_text()
    assert "| strong | 128 | 64 | ddp2 | 2 |" in table
    assert "| weak | 256 | 128 | ddp2 | 2 |" in table
    assert "bound: the efficiency N processes could reach" in table
    assert re.search(
        r"- ddp2, strong scaling: 90% efficiency (from a global batch of|at none)", table
    )
    assert "- ddp2, weak scaling: 90% efficiency" in table
    assert (
        yaml.safe_load((out / "batch128" / "params.yaml").read_text())["train"]["batch_size"] == 128
    )
    weak = yaml.safe_load((out / "weak-batch128" / "params-b256.yaml").read_text())
    assert weak["train"]["batch_size"] == 256
    assert not (out / "weak-batch128" / "metrics" / "single").exists()


def test_h200_candidates_pair_each_ddp_variant_with_a_baseline_of_the_same_settings() -> None:
    from accelbench.core.params import parse_params
    from accelbench.report.markdown import settings_differing

    raw = yaml.safe_load((REPO / "benchmarks" / "h200-scaling.yaml").read_text())
    params = parse_params(raw)
    baselines, variants = params.report.scaling_baselines, params.variants
    distributed = {name for name, v in variants.items() if v.distributed is not None}
    assert set(baselines) == distributed
    for ddp, base in baselines.items():
        assert variants[base].distributed is None
        assert settings_differing(variants[ddp], variants[base]) == [], (ddp, base)


def test_a_bound_needs_only_the_baselines_in_any_batch_order() -> None:
    """A host with too few GPUs skips the DDP run, yet its two baselines bound it; and the
    baseline at the per-GPU batch may come later in the sweep (`--batch-sizes 1024 512`)."""
    from pathlib import Path

    from accelbench.core.results import Skipped
    from helpers import load_script, trained_summary

    scaling = load_script(REPO / "benchmarks" / "scaling.py")
    here = Path(".")
    runs = {
        ("gpu", 1024): (0, trained_summary(0.12, steady_epochs_s=[0.12, 0.12, 0.13]), here),
        ("ddp2", 1024): (0, Skipped("needs 2 GPUs", "cuda"), here),
        ("ddp4", 1024): (0, Skipped("needs 4 GPUs", "cuda"), here),
    }
    rows = [
        scaling._row("ddp2", "strong", 1024, 2, 0, runs[("ddp2", 1024)][1], runs[("gpu", 1024)][1]),
        scaling._row("ddp4", "strong", 1024, 4, 0, runs[("ddp4", 1024)][1], runs[("gpu", 1024)][1]),
    ]
    world, baselines = {"gpu": 1, "ddp2": 2, "ddp4": 4}, {"ddp2": "gpu", "ddp4": "gpu"}
    scaling._add_bounds(rows, runs, baselines, world)
    assert "bound" not in rows[0]  # gpu at 512 has not run yet
    runs[("gpu", 512)] = (0, trained_summary(0.15, steady_epochs_s=[0.15, 0.15, 0.16]), here)
    scaling._add_bounds(rows, runs, baselines, world)
    assert rows[0]["status"] == "skipped" and rows[0]["bound"] == pytest.approx(0.12 / 0.15)
    assert "bound" not in rows[1]  # ddp4 needs gpu at 256
    assert "| skipped: needs 2 GPUs |" in scaling._markdown(rows, False)


def test_a_rows_speedup_and_its_interval_come_from_one_ratio() -> None:
    """The speedup, its interval and the efficiency are one ratio of medians; a train.json
    from before steady epochs were listed still gets the figure, without an interval."""
    from helpers import load_script, trained_summary

    scaling = load_script(REPO / "benchmarks" / "scaling.py")
    base = trained_summary(0.20, steady_epochs_s=[0.19, 0.20, 0.21, 0.20])
    ddp = trained_summary(0.11, steady_epochs_s=[0.10, 0.11, 0.12, 0.11], world_size=2)
    row = scaling._row("ddp2", "strong", 1024, 2, 0, ddp, base)
    assert row["speedup"] == pytest.approx(0.20 / 0.11)
    assert row["efficiency"] == pytest.approx(0.20 / 0.11 / 2)
    assert row["speedup_lo"] < row["speedup"] < row["speedup_hi"]
    assert row["efficiency_lo"] == pytest.approx(row["speedup_lo"] / 2)

    old = scaling._row(
        "ddp2", "strong", 1024, 2, 0,
        trained_summary(0.11, world_size=2), trained_summary(0.20),
    )  # fmt: skip
    assert old["speedup"] == pytest.approx(0.20 / 0.11)
    assert "speedup_lo" not in old
