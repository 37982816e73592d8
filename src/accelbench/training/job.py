"""One variant's training job: what the train stage hands `training.loop.train`.

Imports nothing heavy: the stage builds the job before it imports torch or MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelbench.core.outputs import MetricsFiles
from accelbench.core.params import TrainRecipe, VariantParams
from accelbench.data.datasets import Dataset
from accelbench.training.placement import Placement


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
    quiet: bool = False

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
