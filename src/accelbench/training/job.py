"""One variant's training job, and the hooks that record it: what the train stage hands
`training.loop.train`.

Imports nothing heavy: the stage builds the job before it imports torch or MLflow.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.core.outputs import MetricsFiles
from accelbench.core.params import TrainRecipe, VariantParams
from accelbench.core.progress import EpochProgress
from accelbench.data.datasets import Dataset
from accelbench.training.placement import Placement

if TYPE_CHECKING:
    import torch

    from accelbench.core.results import EpochRecord, ModelFile, TrainSummary
    from accelbench.training.checkpoint import Resume


@dataclass(frozen=True)
class TrainOutputs:
    model: Path
    metrics: MetricsFiles
    checkpoint: Path | None = None  # per-epoch training state, for resuming after a kill
    profile: Path | None = None  # folder for a torch.profiler trace of steady-state steps
    # torch.compile's portable cache: loaded before compiling, rewritten after training
    compile_cache: Path | None = None


@dataclass(frozen=True)
class TrainJob:
    """A variant to train in this process: the recipe and variant, the dataset and its
    prepared folder, where this process trains, and where the outputs go."""

    name: str  # the variant's
    recipe: TrainRecipe
    variant: VariantParams
    dataset: Dataset  # params.data.dataset, checked against the prepared folder's manifest
    prepared_dir: Path
    placement: Placement
    out: TrainOutputs
    root: Path  # the workspace: MLflow's store and the FLOPs cache are found from it

    @property
    def run_params(self) -> dict[str, Any]:
        """What produced the run: logged to MLflow, kept in the model file, fingerprinted."""
        return run_params(self.name, self.recipe, self.variant, self.dataset)


def run_params(
    name: str, recipe: TrainRecipe, variant: VariantParams, dataset: Dataset | None
) -> dict[str, Any]:
    """A run's params; a skipped variant's (which read no data) have no `data`."""
    run = {"variant": {"name": name, **variant.model_dump()}, "train": recipe.model_dump()}
    return run | ({"data": {"dataset": dataset.name}} if dataset is not None else {})


class TrainHooks:
    """What a training reports as it goes: the train stage sets its hooks up once (its timing
    phases; on rank 0, its progress and the variant's MLflow run). These record nothing."""

    quiet = True  # no progress on the console

    def progress(self, name: str, epochs: int, steps: int) -> EpochProgress:
        return EpochProgress(name, epochs, steps, quiet=self.quiet)

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Around one part of the stage's wall time (`core.phases.PHASES` names them)."""
        return contextlib.nullcontext()

    def run(self, resume: Resume | None) -> contextlib.AbstractContextManager[str | None]:
        """The variant's run around the training, continued from `resume`'s; yields its id."""
        return contextlib.nullcontext()

    def on_epoch(self, record: EpochRecord) -> None:
        """After each epoch of the run's training (not of its repeats)."""

    def trained(self, summary: TrainSummary, model: ModelFile, examples: torch.Tensor) -> None:
        """Once the outputs are written (on rank 0): `examples` are a few test inputs."""
