"""train@V: train one variant; write its model file, `train.json` and `epochs.csv`.

Where it runs is `placement.place`'s call: here, skipped, or re-launched under torchrun,
whose children each train their share of every batch while rank 0 alone writes the
outputs and the MLflow run. Training itself is `training.loop.train` (imported only to train:
a skipped variant's stage imports neither MLflow nor the model code, and returns at once).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelbench.core import phases
from accelbench.core.console import log
from accelbench.core.params import Params, TrainRecipe, VariantParams
from accelbench.core.results import (
    MetricsFiles,
    ModelFile,
    Skipped,
    TrainResult,
    TrainSummary,
    claim,
    read_train,
    remove_leftovers,
    staged,
    write_epochs_csv,
    write_json,
)
from accelbench.data import mnist as data
from accelbench.system import lifetime
from accelbench.training import torchrun
from accelbench.training.placement import place

# Read only to refuse a run, never to shape an output: not in dvc.yaml (the env stage
# enforces it on every repro).
CHECKS = ("train.require_gpu",)


@dataclass(frozen=True)
class TrainInputs:
    recipe: TrainRecipe
    variant: VariantParams
    require_gpu: bool


def select(params: Params, name: str) -> TrainInputs:
    train = params.train
    return TrainInputs(
        recipe=TrainRecipe(**{key: getattr(train, key) for key in TrainRecipe.model_fields}),
        variant=params.variant(name),
        require_gpu=train.require_gpu,
    )


@dataclass(frozen=True)
class TrainOutputs:
    model: Path
    metrics: MetricsFiles
    checkpoint: Path | None = None  # per-epoch training state, for resuming after a kill
    profile: Path | None = None  # folder for a torch.profiler trace of steady-state steps


def run(
    root: Path,
    name: str,
    inputs: TrainInputs,
    prepared_dir: Path,
    out: TrainOutputs,
    *,
    quiet: bool = False,
    argv: list[str] | None = None,
    locks: tuple[int, ...] = (),
) -> TrainResult | None:
    """Train (or skip) one variant; None in a process that writes no outputs. `locks`: the
    file descriptors of `lifetime.sole_writer`'s locks, which torchrun holds too."""
    claim(out.model, out.metrics.train_json, out.metrics.epochs_csv)  # before any work
    with phases.phase("device"):  # NVML alone where it settles a skip
        placement = place(name, inputs.variant, require_gpu=inputs.require_gpu)
    if placement.skip_reason is not None:
        return record_skip(root, name, inputs, placement.skip_reason, out)
    if placement.launch:
        cfg = inputs.variant.distributed
        with phases.phase("launch"):
            torchrun.launch(name, cfg, argv or [], keep_fds=locks)
        if cfg.node_rank != 0:
            log(f"train {name}: node {cfg.node_rank} done; node 0 writes the outputs")
            return None
        summary = read_train(out.metrics.train_json)
        if isinstance(summary, TrainSummary):
            phases.RECORDER.training_s = summary.total_train_s
        return summary
    with phases.phase("imports"):  # MLflow and the model code: only to train
        from accelbench.training.loop import train

    dataset = data.prepared_dataset(prepared_dir).name  # the data decides the model
    run_params = _run_params(name, inputs.recipe, inputs.variant, dataset)
    with torchrun.process_group(placement):
        return train(
            root,
            name,
            run_params,
            dataset,
            inputs.recipe,
            inputs.variant,
            placement,
            prepared_dir,
            out,
            quiet,
        )


def record_skip(
    root: Path, name: str, inputs: TrainInputs, reason: str, out: TrainOutputs
) -> Skipped:
    """A variant this machine cannot run: its outputs say so, and why (compare records it in
    MLflow, with the params in its model file)."""
    log(f"train {name}: skipped: {reason}")
    remove_leftovers(out.model, out.metrics.train_json, out.metrics.epochs_csv)
    run_params = _run_params(name, inputs.recipe, inputs.variant)
    skipped = Skipped(reason, inputs.variant.device)
    with phases.phase("outputs"), staged() as outputs:
        write_json(outputs(out.metrics.train_json), skipped.to_json())
        write_epochs_csv(outputs(out.metrics.epochs_csv), [])
        model_file = ModelFile(name, "skipped", None, params=run_params, reason=reason)
        model_file.save(outputs(out.model))
    return skipped


def _run_params(
    name: str, recipe: TrainRecipe, variant: VariantParams, dataset: str | None = None
) -> dict[str, Any]:
    """What produced the run: logged to MLflow, kept in the model file, fingerprinted."""
    run = {"variant": {"name": name, **variant.model_dump()}, "train": recipe.model_dump()}
    return run | ({"data": {"dataset": dataset}} if dataset else {})


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    lifetime.end_with_launcher()  # no training outlives the `dvc repro` that started it
    phases.RECORDER.stage = f"train@{args.variant}"
    inputs = select(params, args.variant)
    if inputs.recipe.deterministic:
        from accelbench.training.engine import request_determinism

        request_determinism(os.environ)  # before anything touches the GPU
    out = TrainOutputs(args.model, MetricsFiles(args.metrics), args.checkpoint, args.profile)
    with lifetime.sole_writer(args.variant, out.model, out.checkpoint) as locks:
        run(
            root,
            args.variant,
            inputs,
            args.data,
            out,
            quiet=args.quiet,
            argv=args.argv,
            locks=locks,
        )
