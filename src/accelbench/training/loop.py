"""A variant's training in this process: the model and batches, the fit (retried after an
out-of-memory error, resumed from a checkpoint), the MLflow run, and the outputs.

The train stage (`stages/train.py`) decides where a variant runs and imports this module
only to train: a skipped variant's stage never imports MLflow or the model code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from accelbench.core import phases
from accelbench.core.console import log
from accelbench.core.params import TrainRecipe, VariantParams
from accelbench.core.progress import EpochProgress, fmt_seconds
from accelbench.core.results import (
    ModelFile,
    TrainSummary,
    remove_leftovers,
    staged,
    write_epochs_csv,
    write_json,
)
from accelbench.data import mnist as data
from accelbench.data.batches import ResidentBatches
from accelbench.system import hardware, tracking
from accelbench.training import build, engine, profiling
from accelbench.training.checkpoint import Checkpointer, Resume
from accelbench.training.oom import retry_on_oom
from accelbench.training.placement import Placement
from accelbench.training.run_summary import summarize_run

if TYPE_CHECKING:
    from accelbench.stages.train import TrainOutputs

FLOPS_CACHE = Path(".accelbench") / "flops.json"  # the model's FLOPs, counted once


def train(
    root: Path,
    name: str,
    run_params: dict[str, Any],
    dataset: str,
    recipe: TrainRecipe,
    variant: VariantParams,
    placement: Placement,
    prepared_dir: Path,
    out: TrainOutputs,
    quiet: bool,
) -> TrainSummary | None:
    with phases.phase("device"):
        engine.configure_backends(variant, recipe.deterministic)
        engine.start_device(placement.device)
    with phases.phase("model"):
        flops_per_sample = build.flops_per_sample(recipe, dataset, root / FLOPS_CACHE)
    fitting = _Fitting.build(name, recipe, variant, placement, prepared_dir, out.profile, dataset)
    steps = len(fitting.batches)
    if placement.main:
        log(_start_line(name, recipe, variant, placement, fitting.batches.num_samples))
        remove_leftovers(out.model, out.metrics.train_json, out.metrics.epochs_csv)
    checkpoint_path = out.checkpoint if placement.world_size == 1 else None  # DDP starts over
    checkpointer = Checkpointer(checkpoint_path, run_params, name)
    with phases.phase("checkpoint"):
        resume = checkpointer.load()
    if out.profile is not None:
        epochs_done = resume.epochs_done if resume else 0
        profiling.check_request(name, recipe.epochs, steps, epochs_done)
    with _tracked_run(root, name, run_params, variant, placement, resume) as run_id:
        if placement.main and resume is None:
            with phases.phase("mlflow"):
                _log_datasets(prepared_dir, recipe, dataset)
        progress = EpochProgress(name, recipe.epochs, steps, quiet=quiet or not placement.main)
        with phases.phase("training"):
            records, accumulation = fitting.fit(progress, resume, checkpointer.saver(run_id))
        progress.close()
        compile_cache = engine.compile_cache_state()  # before repeats find every graph cached
        state_dict = {k: v.detach().cpu() for k, v in fitting.model.state_dict().items()}
        with phases.phase("training"):
            repeats = fitting.repeat(recipe.repeats - 1, accumulation, quiet)
        if not placement.main:
            return None
        summary = summarize_run(
            records,
            variant,
            placement,
            accumulation_steps=accumulation,
            flops_per_sample=flops_per_sample,
            repeats=repeats,
            compile_cache=compile_cache,
        )
        model_file = ModelFile(name, "trained", run_id, run_params, state_dict)
        phases.RECORDER.training_s = summary.total_train_s
        with phases.phase("outputs"), staged() as outputs:  # all new or all old
            write_json(outputs(out.metrics.train_json), summary.to_json())
            write_epochs_csv(outputs(out.metrics.epochs_csv), [r.as_dict() for r in records])
            model_file.save(outputs(out.model))
        _track_outputs(name, summary, model_file, out, fitting.test_batches.images[:4], dataset)
    log(
        f"train {name}: first epoch {summary.first_epoch_s:.2f} s, steady "
        f"{fmt_seconds(summary.steady_epoch_s)}, test accuracy "
        f"{summary.final_test_accuracy:.2%}"
    )
    checkpointer.discard()
    return summary


@dataclass
class _Fitting:
    """A variant's model and batches in this process, and how they are fitted: once, or
    again from scratch after each CUDA out-of-memory error (`oom.retry_on_oom`)."""

    name: str
    recipe: TrainRecipe
    variant: VariantParams
    placement: Placement
    model: torch.nn.Module
    batches: engine.BatchSource
    test_batches: ResidentBatches
    profile_dir: Path | None
    dataset: str = "mnist"

    @classmethod
    def build(
        cls,
        name: str,
        recipe: TrainRecipe,
        variant: VariantParams,
        placement: Placement,
        prepared_dir: Path,
        profile_dir: Path | None,
        dataset: str = "mnist",
    ) -> _Fitting:
        device = placement.device
        with phases.phase("model"):
            model = build.fresh_model(recipe, variant, device, dataset)
        shard = {"rank": placement.rank, "world_size": placement.world_size}
        with phases.phase("data"):
            batches = build.train_batches(recipe, variant, prepared_dir, device, **shard)
            test_batches = build.eval_batches(
                prepared_dir,
                device,
                recipe.eval_batch_size,
                recipe.test_subset,
                channels_last=variant.channels_last,
            )
        return cls(
            name, recipe, variant, placement, model, batches, test_batches, profile_dir, dataset
        )

    def fit(
        self,
        progress: EpochProgress,
        resume: Resume | None,
        on_checkpoint: Callable[[dict[str, Any]], None] | None,
    ) -> tuple[list[engine.EpochRecord], int]:
        """Epoch records, and the accumulation steps they were trained with."""
        recipe = self.recipe

        def attempt(accumulation_steps: int, fresh: bool) -> list[engine.EpochRecord]:
            # after an OOM: from scratch, the checkpoint's state left behind
            resume_from = resume.state if resume and not fresh else None
            return self._fit_once(
                progress, accumulation_steps, fresh, resume_from, on_checkpoint, track=True
            )

        return retry_on_oom(
            attempt,
            name=self.name,
            batch_size=recipe.batch_size,
            accumulation_steps=recipe.accumulation_steps,
            retries=recipe.oom_retries,
            placement=self.placement,
        )

    def repeat(
        self, count: int, accumulation_steps: int, quiet: bool
    ) -> list[list[engine.EpochRecord]]:
        """`count` more trainings from scratch, timed only (`train.repeats`): same seed,
        recipe and accumulation as the run; their epochs are neither tracked nor kept, and the
        run's model must be taken before (this replaces it)."""
        repeats = []
        for index in range(count):
            progress = EpochProgress(
                f"{self.name} repeat {index + 2}/{count + 1}",
                self.recipe.epochs,
                len(self.batches),
                quiet=quiet or not self.placement.main,
            )
            repeats.append(self._fit_once(progress, accumulation_steps, True, None, None, False))
            progress.close()
        return repeats

    def _fit_once(
        self,
        progress: EpochProgress,
        accumulation_steps: int,
        fresh: bool,
        resume_from: dict[str, Any] | None,
        on_checkpoint: Callable[[dict[str, Any]], None] | None,
        track: bool,
    ) -> list[engine.EpochRecord]:
        """One training: of the model as it is (`fresh`: of a new seeded one), its epochs
        logged to the run where `track`."""
        recipe, variant, placement = self.recipe, self.variant, self.placement
        device = placement.device
        with phases.phase("device"):  # NVML's and RAPL's energy counters
            energy_j = hardware.gpu_energy_reader(device.index or 0) if variant.uses_cuda else None
            cpu_energy_j = hardware.cpu_energy_reader()  # the host's share, every variant

        def on_epoch(record: engine.EpochRecord) -> None:
            progress.epoch_done(record)
            if placement.main and track:
                tracking.log_metrics(record.as_dict(), step=record.epoch)

        if fresh:
            self.model = build.fresh_model(recipe, variant, device, self.dataset)
        # one profile per attempt: an OOM retry starts counting steps again
        with profiling.step_profiler(
            self.profile_dir if track else None,
            self.name,
            placement.rank,
            len(self.batches),
            cuda=variant.uses_cuda,
        ) as profile_step:

            def on_step(samples: int) -> None:
                progress.step(samples)
                profile_step()

            return engine.fit(
                self.model,
                self.batches,
                self.test_batches,
                recipe,
                variant,
                device,
                accumulation_steps=accumulation_steps,
                distributed=placement.backend is not None,
                on_epoch=on_epoch,
                on_step=on_step,
                energy_j=energy_j,
                cpu_energy_j=cpu_energy_j,
                resume_from=resume_from,
                on_checkpoint=on_checkpoint,
            )


def _start_line(
    name: str, recipe: TrainRecipe, variant: VariantParams, placement: Placement, samples: int
) -> str:
    world_size = placement.world_size
    return (
        f"train {name}: {placement.device_name}, {variant.precision}, {variant.batches} "
        f"batches, {samples} samples x {recipe.epochs} epochs, batch {recipe.batch_size}"
        + (f" over {world_size} processes" if world_size > 1 else "")
    )


def _tracked_run(
    root: Path,
    name: str,
    run_params: dict[str, Any],
    variant: VariantParams,
    placement: Placement,
    resume: Resume | None,
) -> contextlib.AbstractContextManager[str | None]:
    """The variant's MLflow run: continued when resuming, none outside rank 0."""
    if not placement.main:
        return contextlib.nullcontext(None)
    if resume is not None and resume.mlflow_run_id:
        return tracking.resume_run(root, resume.mlflow_run_id)  # one variant, one run
    tags = {
        "status": "trained",
        "device": variant.device,
        "device_name": placement.device_name,
        "torch": torch.__version__,
        "cuda_runtime": str(torch.version.cuda),
        "precision": variant.precision,
        "world_size": str(placement.world_size),
    }
    return tracking.variant_run(root, name, run_params, tags, system_metrics=True)


def _log_datasets(prepared_dir: Path, recipe: TrainRecipe, dataset: str) -> None:
    for split, limit, context in (
        ("train", recipe.train_subset, "training"),
        ("test", recipe.test_subset, "evaluation"),
    ):
        arrays = data.load_split(prepared_dir, split, limit)
        digest = data.dataset_digest(split, limit, prepared_dir)
        tracking.log_dataset(
            f"{dataset}-{split}", arrays.images, arrays.labels, prepared_dir, digest, context
        )


def _track_outputs(
    name: str,
    summary: TrainSummary,
    model_file: ModelFile,
    out: TrainOutputs,
    example_images: torch.Tensor,
    dataset: str,
) -> None:
    tracking.log_train_summary(summary)
    tracking.log_artifact(out.metrics.epochs_csv)
    for path in sorted(out.profile.glob(f"{name}-rank0.*")) if out.profile else ():
        tracking.log_artifact(path, "profile")
    example = example_images.float().cpu().contiguous().numpy()
    tracking.log_model(build.trained_model(model_file.state_dict, dataset=dataset), example, name)
