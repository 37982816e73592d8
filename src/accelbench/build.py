"""How the pipeline builds a variant's model and batches; the benchmarks build them the same way."""

from __future__ import annotations

from pathlib import Path

import torch

from . import data, engine
from .batches import LoaderBatches, ResidentBatches
from .console import InputError
from .models import for_dataset
from .params import LoaderParams, TrainRecipe, VariantParams


def fresh_model(
    train: TrainRecipe, variant: VariantParams, device: torch.device, dataset: str = "mnist"
) -> torch.nn.Module:
    """The dataset's seeded initial model, on its device: the same weights for every variant."""
    engine.seed_everything(train.seed)
    memory_format = torch.channels_last if variant.channels_last else torch.preserve_format
    return for_dataset(dataset, train.dropout).to(device, memory_format=memory_format)


def trained_model(
    state_dict: dict[str, torch.Tensor], source: str = "model file", dataset: str = "mnist"
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


def flops_per_sample(train: TrainRecipe, dataset: str = "mnist") -> int:
    shape = data.DATASETS[dataset].input_shape
    return engine.train_flops_per_sample(for_dataset(dataset, train.dropout), shape)


def train_batches(
    train: TrainRecipe,
    variant: VariantParams,
    prepared_dir: Path,
    device: torch.device,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> engine.BatchSource:
    """The variant's training batches: this process's share of every global batch."""
    split = data.load_split(prepared_dir, "train", train.train_subset)
    if variant.batches == "resident":
        return ResidentBatches(
            split,
            device,
            train.batch_size,
            train.seed,
            channels_last=variant.channels_last,
            rank=rank,
            world_size=world_size,
        )
    return LoaderBatches(
        prepared_dir,
        data.prepared_dataset(prepared_dir),
        len(split.labels),
        device,
        train.batch_size,
        train.seed,
        variant.loader or LoaderParams(),
        channels_last=variant.channels_last,
        rank=rank,
        world_size=world_size,
    )


def eval_batches(
    prepared_dir: Path,
    device: torch.device,
    batch_size: int,
    subset: int,
    *,
    channels_last: bool = False,
) -> ResidentBatches:
    """The test set, resident on `device`, in file order."""
    split = data.load_split(prepared_dir, "test", subset)
    return ResidentBatches(
        split, device, batch_size, seed=0, shuffle=False, channels_last=channels_last
    )
