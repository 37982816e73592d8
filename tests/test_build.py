"""build.py: the model and batches a variant trains with, the same for the pipeline and the
benchmarks (dropout, channels_last, the variant's own DataLoader settings), from the dataset
the params name and the prepared folder holds."""

from __future__ import annotations

import pytest
import torch

from accelbench.core.console import InputError
from accelbench.core.params import TrainRecipe, VariantParams
from accelbench.data.datasets import DATASETS
from accelbench.training import build
from helpers import CPU

MNIST = DATASETS["mnist"]


def test_the_model_is_seeded_and_built_as_the_recipe_and_variant_say() -> None:
    recipe = TrainRecipe(seed=3, dropout=0.1)
    variant = VariantParams(device="cpu", channels_last=True)
    first, second = (build.fresh_model(MNIST, recipe, variant, CPU) for _ in range(2))
    for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert first.features[5].p == 0.1
    assert first.features[2].weight.is_contiguous(memory_format=torch.channels_last)


def test_counting_the_flops_leaves_the_random_generators_as_they_were() -> None:
    model = build.fresh_model(MNIST, TrainRecipe(), VariantParams(device="cpu"), CPU)
    before = torch.get_rng_state()
    assert build.flops_per_sample(MNIST, model) > 0  # its dropout draws, in train mode
    assert torch.equal(torch.get_rng_state(), before)


def test_a_dataloader_variant_uses_its_own_loader_settings(prepared) -> None:
    loader = {"num_workers": 0, "pin_memory": False, "persistent_workers": False}
    variant = VariantParams(device="cpu", batches="dataloader", loader=loader)
    batches = build.train_batches(MNIST, TrainRecipe(batch_size=128), variant, prepared, CPU)
    assert batches.loader.num_workers == 0 and len(batches) == 4


def test_a_folder_prepared_from_another_dataset_is_refused(prepared) -> None:
    build.check_prepared(MNIST, prepared)
    with pytest.raises(InputError, match=r"holds mnist, but params\.data\.dataset is cifar10"):
        build.check_prepared(DATASETS["cifar10"], prepared)
