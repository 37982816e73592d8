"""Train several variants side by side in one process and print a table, for tuning.

    python benchmarks/variants.py                      # every variant in params.yaml
    python benchmarks/variants.py gpu amp --epochs 3   # a few, shorter
    python benchmarks/variants.py --set amp.compile=default --set amp.precision=bf16

Needs `dvc repro prepare` (or a full `dvc repro`) first for data/prepared. Nothing is
written to MLflow or DVC: the pipeline's report stays the figure of record.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from accelbench.core.console import script_main
from accelbench.core.params import TrainParams, VariantParams, parse_params, read_yaml
from accelbench.core.results import EpochRecord
from accelbench.data.batches import Batches
from accelbench.data.prepared import prepared_dataset
from accelbench.training import build, engine, placement


def _apply(raw: dict, assignment: str) -> None:
    """`amp.compile=default` -> raw['variants']['amp']['compile'] = 'default'."""
    key, _, value = assignment.partition("=")
    *path, leaf = key.split(".")
    target = raw["variants"] if path and path[0] in raw["variants"] else raw
    for part in path:
        target = target[part]
    target[leaf] = read_yaml(value)  # as `dvc exp run -S` reads it (YAML 1.2)


@dataclass(frozen=True)
class Built:
    """A variant's model and batches, as the pipeline builds them (build.py)."""

    device: torch.device
    model: torch.nn.Module
    train_batches: Batches
    test_batches: Batches


def build_as_pipeline(
    device: torch.device, variant: VariantParams, recipe: TrainParams, prepared: Path
) -> Built:
    """Built as the pipeline builds them, so that a tuning row is a pipeline row."""
    engine.configure_backends(variant, recipe.deterministic)
    dataset = prepared_dataset(prepared)  # the prepared data decides the model
    return Built(
        device,
        build.fresh_model(dataset, recipe, variant, device),
        build.train_batches(dataset, recipe, variant, prepared, device),
        build.eval_batches(
            dataset, prepared, device, recipe.eval_batch_size, recipe.test_subset,
            channels_last=variant.channels_last,
        ),
    )  # fmt: skip


def fit_as_pipeline(
    built: Built,
    variant: VariantParams,
    recipe: TrainParams,
    on_step: Callable[[int], None] | None = None,
) -> list[EpochRecord]:
    spec = engine.FitSpec(
        recipe, variant, built.device, accumulation_steps=recipe.accumulation_steps
    )
    return engine.fit(
        built.model, built.train_batches, built.test_batches, spec,
        engine.FitHooks(on_step=on_step),
    )  # fmt: skip


def _time(name: str, variant: VariantParams, recipe: TrainParams, prepared: Path) -> tuple:
    """One table row: train `name` as the pipeline would, in this process."""
    if variant.distributed is not None:
        return (name, "skipped: DDP (benchmarks/scaling.py)", "", "", "", "")
    where = placement.place(name, variant, require_gpu=recipe.require_gpu)
    if where.skip_reason is not None:
        return (name, f"skipped: {where.skip_reason}", "", "", "", "")
    built = build_as_pipeline(where.device, variant, recipe, prepared)
    records = fit_as_pipeline(built, variant, recipe)
    summary = engine.summarize(records)
    print(f"{name}: done", file=sys.stderr, flush=True)
    return (
        name,
        where.device_name[:30],
        f"{summary.first_epoch_s:.3f}",
        f"{summary.steady_epoch_s:.3f}" if summary.steady_epoch_s else "n/a",
        f"{summary.data_wait_fraction:.0%}",
        f"{summary.final_test_accuracy:.2%}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help="variant names (default: all)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--data", type=Path, default=Path("data/prepared"))
    parser.add_argument("--epochs", type=int, help="override train.epochs")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a param: train.batch_size=1024 or amp.precision=bf16",
    )
    args = parser.parse_args(argv)

    raw = read_yaml(args.params.read_text())
    if args.epochs:
        raw["train"]["epochs"] = args.epochs
    for assignment in args.set:
        _apply(raw, assignment)
    params = parse_params(raw, str(args.params))
    names = args.variants or list(params.variants)
    variants = {name: params.variant(name) for name in names}  # all known before any training

    rows = [_time(name, variant, params.train, args.data) for name, variant in variants.items()]
    head = ("variant", "device", "first epoch s", "steady epoch s", "data wait", "test acc")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(script_main(main, "variants.py"))
