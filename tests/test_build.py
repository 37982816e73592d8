"""build.py: the model and batches a variant trains with, the same for the pipeline and the
benchmarks (dropout, channels_last, the variant's own DataLoader settings)."""

from __future__ import annotations

import torch

from accelbench.core.params import TrainRecipe, VariantParams
from accelbench.training import build
from helpers import CPU


def test_the_model_is_seeded_and_built_as_the_recipe_and_variant_say() -> None:
    recipe = TrainRecipe(seed=3, dropout=0.1)
    variant = VariantParams(device="cpu", channels_last=True)
    first, second = (build.fresh_model(recipe, variant, CPU) for _ in range(2))
    for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert first.features[5].p == 0.1
    assert first.features[2].weight.is_contiguous(memory_format=torch.channels_last)


def test_a_dataloader_variant_uses_its_own_loader_settings(prepared) -> None:
    loader = {"num_workers": 0, "pin_memory": False, "persistent_workers": False}
    variant = VariantParams(device="cpu", batches="dataloader", loader=loader)
    batches = build.train_batches(TrainRecipe(batch_size=128), variant, prepared, CPU)
    assert batches.loader.num_workers == 0 and len(batches) == 4
