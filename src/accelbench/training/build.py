"""How the pipeline builds a variant's model and batches from a dataset and its prepared
folder; the benchmarks build them the same way."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from accelbench.core.console import InputError
from accelbench.core.params import LoaderParams, TrainRecipe, VariantParams
from accelbench.data import prepared
from accelbench.data.batches import Batches, LoaderBatches, ResidentBatches
from accelbench.data.datasets import Dataset
from accelbench.training import engine
from accelbench.training.models import for_dataset


def check_prepared(dataset: Dataset, prepared_dir: Path) -> None:
    """The prepared folder holds `dataset` (params.data.dataset), as its manifest says; a
    folder prepared from another is an InputError saying what to run."""
    found = prepared.prepared_dataset(prepared_dir)
    if found.name != dataset.name:
        raise InputError(
            f"{prepared_dir}: holds {found.name}, but params.data.dataset is {dataset.name}; "
            "run `accelbench prepare` (or `dvc repro prepare`) again"
        )


def fresh_model(
    dataset: Dataset, recipe: TrainRecipe, variant: VariantParams, device: torch.device
) -> torch.nn.Module:
    """The dataset's seeded initial model, on its device: the same weights for every variant."""
    engine.seed_everything(recipe.seed)
    memory_format = torch.channels_last if variant.channels_last else torch.preserve_format
    return for_dataset(dataset, recipe.dropout).to(device, memory_format=memory_format)


def trained_model(
    dataset: Dataset, state_dict: dict[str, torch.Tensor], source: str = "model file"
) -> torch.nn.Module:
    """The dataset's trained model on the CPU, in eval mode (where dropout is inactive);
    weights of another model or shape are an InputError naming `source`."""
    model = for_dataset(dataset)
    try:
        model.load_state_dict(state_dict)
    except (RuntimeError, TypeError, AttributeError) as exc:
        first = " ".join(str(exc).split())[:160]
        raise InputError(
            f"{source}: its weights do not fit accelbench's model ({first}); re-run train for it"
        ) from None
    return model.eval()


def flops_per_sample(dataset: Dataset, model: torch.nn.Module, cache: Path | None = None) -> int:
    """Training FLOPs per sample of `model` (the dataset's), counted once per model and torch
    version: counting imports much of torch's tracing machinery (seconds), so the train
    stages share one count through `cache` (a JSON file keyed by the model's layers)."""
    shape = dataset.input_shape
    key = f"{torch.__version__}\n{model!r}\n{tuple(shape)}"
    key = hashlib.sha256(key.encode()).hexdigest()[:16]
    known: dict[str, int] = {}
    if cache is not None:
        try:
            known = {k: int(v) for k, v in json.loads(cache.read_text()).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            known = {}  # missing or unreadable: count again
    if key not in known:
        known[key] = engine.train_flops_per_sample(model, shape)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=2) + "\n")
            os.replace(tmp, cache)
    return known[key]


def train_batches(
    dataset: Dataset,
    recipe: TrainRecipe,
    variant: VariantParams,
    prepared_dir: Path,
    device: torch.device,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Batches:
    """The variant's training batches: this process's share of every global batch."""
    split = prepared.load_split(prepared_dir, "train", recipe.train_subset)
    shard = {"channels_last": variant.channels_last, "rank": rank, "world_size": world_size}
    if variant.batches == "resident":
        return ResidentBatches(split, dataset, device, recipe.batch_size, recipe.seed, **shard)
    return LoaderBatches(
        prepared_dir,
        dataset,
        len(split.labels),
        device,
        recipe.batch_size,
        recipe.seed,
        variant.loader or LoaderParams(),
        **shard,
    )


def eval_batches(
    dataset: Dataset,
    prepared_dir: Path,
    device: torch.device,
    batch_size: int,
    subset: int,
    *,
    channels_last: bool = False,
) -> ResidentBatches:
    """The test set, resident on `device`, in file order."""
    split = prepared.load_split(prepared_dir, "test", subset)
    return ResidentBatches(
        split, dataset, device, batch_size, seed=0, shuffle=False, channels_last=channels_last
    )
