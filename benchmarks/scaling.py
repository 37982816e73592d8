"""DDP scaling: train single-GPU baselines and DDP variants at several batch sizes.

    python benchmarks/scaling.py --candidates benchmarks/h200-scaling.yaml \\
        --batch-sizes 512 4096 --scaling strong weak --out scaling --profile

Strong scaling (the default) trains every candidate at each batch size as the global batch:
the DDP processes split it. Weak scaling keeps each GPU's batch: a DDP variant of N processes
trains at N times the batch size, against its baseline at the batch size itself. Either way
every epoch is the same 60,000 samples, so speedup = the baseline's steady epoch / the DDP
variant's, and efficiency = speedup / processes, each with its 95% bootstrap interval over
the steady epochs (accelbench.core.spread). Where the sweep also trained the baseline at the
per-GPU batch B/N, a strong-scaling row gets its bound: with the all-reduce free and the
ranks in step, N processes at global batch B would each do 1/N of the epoch at batch B/N,
so efficiency could reach T1(B) / T1(B/N) and no more. Efficiency below the bound is what
DDP itself costs; the bound below 100% is per-GPU work that does not shrink with the batch.

Each candidate trains through `accelbench train` (so DDP variants go through torchrun, as in
`dvc repro`), one after another on an otherwise idle machine. The candidates file is a
params file; its `report.scaling_baselines` maps each DDP variant to the single-GPU variant
with the same settings, as the pipeline's report reads it. Writes OUT/scaling.md and OUT/scaling.json: steady epoch time, throughput,
speedup over the baseline and scaling efficiency (speedup / processes) at each batch size,
and, with --profile, the GPU time per step read from each run's torch.profiler trace
(profiled runs are a little slower: their epoch times are marked). Needs data/prepared
(`dvc repro prepare`). Nothing here is a DVC output; docs/results/ records the outcome.
OUT/batchB/ holds strong scaling at batch B, OUT/weak-batchB/ weak scaling; a baseline
trained for one is reused by the other.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from accelbench.core.console import InputError, script_main
from accelbench.core.outputs import MetricsFiles
from accelbench.core.params import parse_params
from accelbench.core.progress import fmt_interval
from accelbench.core.results import (
    TrainResult,
    TrainSummary,
    read,
    scaling_efficiency,
    speedup,
)
from accelbench.core.spread import Figure, ratio_of_medians


def _run(
    params: Path, name: str, data: Path, out: Path, profile: Path | None
) -> tuple[int, TrainResult | None]:
    metrics = out / "metrics" / name
    command = [
        sys.executable, "-m", "accelbench.cli", "--params", str(params), "train", name,
        "--data", str(data), "--model", str(out / "models" / f"{name}.pt"),
        "--metrics", str(metrics), "--quiet",
    ]  # fmt: skip
    if profile is not None:
        command += ["--profile", str(profile)]
        for stale in profile.glob(f"{name}-rank*.*"):  # an earlier sweep's, into the same --out
            stale.unlink()
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink:
        code = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, check=False)
    train_json = MetricsFiles(metrics).train_json
    return code.returncode, read(TrainResult, train_json) if train_json.exists() else None


def _row(
    name: str,
    scaling: str,
    batch: int,
    world: int,
    code: int,
    train: TrainResult | None,
    base: TrainResult | None,
) -> dict[str, Any]:
    """One table row; `base`: the baseline at this row's global batch (for the speedup)."""
    row: dict[str, Any] = {
        "variant": name,
        "scaling": scaling,
        "batch_size": batch,  # the global batch
        "per_gpu_batch": batch // world,
        "returncode": code,
    }
    row["status"] = train.status if code == 0 and train is not None else "failed"
    if not isinstance(train, TrainSummary) or row["status"] != "trained":
        row["reason"] = getattr(train, "reason", None)
        return row
    row |= {
        "world_size": train.world_size,
        "first_epoch_s": train.first_epoch_s,
        "steady_epoch_s": train.steady_epoch_s,
        "steady_samples_per_s": train.steady_samples_per_s,
        "final_test_accuracy": train.final_test_accuracy,
        "peak_gpu_mem_mib": train.peak_gpu_mem_mib,
    }
    ratio = _ratio(base, train)
    if ratio is not None:
        world = train.world_size
        row |= {"speedup": ratio.value, "efficiency": scaling_efficiency(ratio.value, world)}
        if ratio.has_interval:
            row |= {"speedup_lo": ratio.lo, "speedup_hi": ratio.hi}
            row |= {"efficiency_lo": ratio.lo / world, "efficiency_hi": ratio.hi / world}
    return row


Runs = dict[tuple[str, int], tuple[int, "TrainResult | None", Path]]


def _add_bounds(
    rows: list[dict[str, Any]], runs: Runs, baselines: dict[str, str], world: dict[str, int]
) -> None:
    """Each strong-scaling DDP row's bound, from its baseline at the global batch and at the
    per-GPU batch, wherever the sweep trained both: whatever became of the DDP run itself
    (a host with too few GPUs still gets its bounds) and in whatever order the batches ran."""
    for row in rows:
        name, batch = row["variant"], row["batch_size"]
        n = world.get(name, 1)
        if "bound" in row or row["scaling"] != "strong" or n < 2 or name not in baselines:
            continue  # a bound once drawn stays: each training adds rows, not baselines to them
        if batch % n:
            continue
        whole, part = (runs.get((baselines[name], size)) for size in (batch, batch // n))
        bound = _ratio(whole[1], part[1]) if whole and part else None
        if bound is not None:
            row |= bound.fields("bound")


def _ratio(slow: TrainResult | None, fast: TrainResult | None) -> Figure | None:
    """slow's median steady epoch / fast's, with its bootstrap interval where both list their
    steady epochs (an older train.json: the figure alone); None unless both trained more than
    one epoch."""
    if not isinstance(slow, TrainSummary) or not isinstance(fast, TrainSummary):
        return None
    if slow.steady_epochs_s and fast.steady_epochs_s:
        return ratio_of_medians(slow.steady_epochs_s, fast.steady_epochs_s)
    ratio = speedup(slow, fast)
    return Figure(ratio) if ratio is not None else None


def _profile_summary(profile: Path | None, name: str) -> dict[str, Any] | None:
    path = profile / f"{name}-rank0.json" if profile else None
    return json.loads(path.read_text()) if path and path.exists() else None


GOAL = 0.9  # the scaling efficiency the sweep is judged by: the smallest batch reaching it


def _smallest_batch_at(rows: list[dict[str, Any]], goal: float) -> list[str]:
    """One line per DDP variant and scaling: the smallest global batch whose efficiency
    reached `goal`, or that none of the batches measured did."""
    lines = []
    scaled = [r for r in rows if "efficiency" in r]
    for variant, scaling in dict.fromkeys((r["variant"], r["scaling"]) for r in scaled):
        measured = [r for r in scaled if (r["variant"], r["scaling"]) == (variant, scaling)]
        reached = [r["batch_size"] for r in measured if r["efficiency"] >= goal]
        best = max(measured, key=lambda r: r["efficiency"])
        lines.append(
            f"- {variant}, {scaling} scaling: {goal:.0%} efficiency "
            + (f"from a global batch of {min(reached)}" if reached else
               f"at none of the batches measured (best {best['efficiency']:.0%}, "
               f"at {best['batch_size']})")
        )  # fmt: skip
    return lines


def _markdown(rows: list[dict[str, Any]], profiled: bool) -> str:
    def ms(value: float | None) -> str:
        return f"{value:.3f}" if value is not None else "n/a"

    lines = [
        "| scaling | batch | per GPU | variant | procs | first epoch s | steady epoch s | "
        "samples/s | speedup | efficiency | bound | test acc |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def spread(r: dict[str, Any], key: str, fmt: str, unit: str = "") -> str:
        return fmt_interval(r[key], r.get(f"{key}_lo"), r.get(f"{key}_hi"),
                            lambda value: format(value, fmt) + unit)  # fmt: skip

    for r in rows:
        where = f"| {r['scaling']} | {r['batch_size']} | {r['per_gpu_batch']} | {r['variant']} |"
        bound = spread(r, "bound", ".0%") if r.get("bound") is not None else ""
        if r["status"] != "trained":
            cells = [f"{r['status']}: {r.get('reason') or 'see logs/'}", *[""] * 5, bound, ""]
        else:
            cells = [
                str(r["world_size"]), f"{r['first_epoch_s']:.2f}", f"{r['steady_epoch_s']:.4f}",
                f"{r['steady_samples_per_s']:,.0f}",
                spread(r, "speedup", ".2f", "×") if "speedup" in r else "",
                spread(r, "efficiency", ".0%") if "speedup" in r else "",
                bound, f"{r['final_test_accuracy']:.2%}",
            ]  # fmt: skip
        lines.append(f"{where} " + " | ".join(cells) + " |")
    lines += ["", *_smallest_batch_at(rows, GOAL)]
    if any(r.get("bound") is not None for r in rows):
        lines += [
            "",
            "bound: the efficiency N processes could reach at global batch B with a free "
            "all-reduce and ranks in step, T1(B) / T1(B/N), from the baseline trained at both "
            "batches; below it is what DDP costs, and a bound below 100% is per-GPU work that "
            "does not shrink with the batch. Intervals: 95% bootstrap over the steady epochs.",
        ]
    if profiled:
        lines += [
            "",
            "GPU time per step from each run's profile (rank 0, steps of epoch 2, ms):",
            "",
            "| scaling | batch | variant | steps | GPU span | busy | compute | all-reduce | "
            "exposed all-reduce | idle | kernels/step |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            p = r.get("profile")
            if not p or p.get("span_ms_per_step") is None:
                continue
            lines.append(
                f"| {r['scaling']} | {r['batch_size']} | {r['variant']} | {p['steps']} | "
                f"{ms(p['span_ms_per_step'])} | "
                f"{ms(p['busy_ms_per_step'])} | {ms(p['compute_ms_per_step'])} | "
                f"{ms(p['allreduce_ms_per_step'])} | {ms(p['exposed_allreduce_ms_per_step'])} | "
                f"{p['idle_share']:.0%} | {p['kernels_per_step']:.0f} |"
            )
        lines += ["", "Profiled runs: epoch times include the profiler's overhead in epoch 2."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=Path, default=Path("benchmarks/h200-scaling.yaml"))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[512])
    parser.add_argument(
        "--scaling",
        nargs="+",
        choices=["strong", "weak"],
        default=["strong"],
        help="strong: each batch size is the global batch; weak: it is each GPU's batch",
    )
    parser.add_argument("--data", type=Path, default=Path("data/prepared"))
    parser.add_argument("--out", type=Path, default=Path("scaling"))
    parser.add_argument("--only", nargs="+", help="these candidates only (default: all)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler traces too")
    args = parser.parse_args(argv)

    raw = yaml.safe_load(args.candidates.read_text())
    # every candidate valid before anything runs
    candidates = parse_params(raw, str(args.candidates))
    baselines = candidates.report.scaling_baselines
    names = args.only or list(raw["variants"])
    if unknown := [name for name in names if name not in candidates.variants]:
        raise InputError(
            f"--only {' '.join(unknown)}: not a candidate of {args.candidates}; its candidates: "
            f"{', '.join(candidates.variants)}"
        )
    world = {
        name: v.distributed.world_size if v.distributed else 1
        for name, v in candidates.variants.items()
    }
    rows: list[dict[str, Any]] = []
    # (name, global batch) -> (exit code, train.json, folder): each run made once
    runs: Runs = {}
    for batch in args.batch_sizes:
        for scaling in args.scaling:
            out = args.out / (f"batch{batch}" if scaling == "strong" else f"weak-batch{batch}")
            out.mkdir(parents=True, exist_ok=True)
            profile = out / "profiles" if args.profile else None
            # Baselines first, so every DDP row can be set against its baseline (one process,
            # so at `batch` in either scaling).
            for name in sorted(names, key=lambda n: n in baselines):
                size = batch * world[name] if scaling == "weak" else batch
                if (name, size) not in runs:  # a run the other scaling made is reused
                    params_path = _params_at(raw, args.candidates, size, out, scaling)
                    code, train = _run(params_path, name, args.data, out, profile)
                    runs[(name, size)] = (code, train, out)
                code, train, ran_in = runs[(name, size)]
                base_run = runs.get((baselines[name], batch)) if name in baselines else None
                base = base_run[1] if base_run else None  # none where --only left it out
                row = _row(name, scaling, size, world[name], code, train, base)
                row["profile"] = _profile_summary(ran_in / "profiles" if profile else None, name)
                rows.append(row)
                _add_bounds(rows, runs, baselines, world)
                print(json.dumps({k: row.get(k) for k in ("scaling", "batch_size", "variant",
                      "status", "steady_epoch_s", "speedup", "efficiency")}), flush=True)  # fmt: skip
                (args.out / "scaling.json").write_text(json.dumps(rows, indent=2) + "\n")
                (args.out / "scaling.md").write_text(_markdown(rows, args.profile))
    print(_markdown(rows, args.profile))
    return 0 if all(r["status"] != "failed" for r in rows) else 1


def _params_at(raw: dict[str, Any], source: Path, batch: int, out: Path, scaling: str) -> Path:
    """The candidates at global batch `batch`, checked, written into `out`: params.yaml for
    strong scaling (one batch per folder), params-bB.yaml for weak (one per world size)."""
    at_batch = raw | {"train": raw["train"] | {"batch_size": batch}}
    parse_params(at_batch, f"{source} at batch {batch}")
    path = out / ("params.yaml" if scaling == "strong" else f"params-b{batch}.yaml")
    path.write_text(yaml.safe_dump(at_batch))
    return path


if __name__ == "__main__":
    raise SystemExit(script_main(main, "scaling.py"))
