"""Probe (not shipped): which graphed variants print autograd's AccumulateGrad stream
warning, with the engine under test. Copied into tests/ on the GPU host only."""

from __future__ import annotations

import warnings

import pytest
import torch

from accelbench.core.params import TrainParams, VariantParams
from accelbench.training import engine
from accelbench.training.models import SeedCNN
from helpers import fit_small


@pytest.mark.gpu
@pytest.mark.parametrize("compile_mode", ["none", "default"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_probe(prepared, compile_mode, precision) -> None:
    device = torch.device("cuda")
    train = TrainParams(epochs=2, batch_size=100, seed=0, schedule="onecycle")
    variant = VariantParams(
        device="cuda",
        precision=precision,
        cuda_graph=True,
        compile=compile_mode,
        channels_last=True,
        cudnn_benchmark=True,
        tf32=True,
        fused_optimizer=True,
    )
    engine.configure_backends(variant)
    engine.seed_everything(0)
    model = SeedCNN(dropout=0.0).to(device).to(memory_format=torch.channels_last)
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit_small(prepared, train, variant, device, model=model)
    finally:
        torch.set_warn_always(False)
    hits = [str(w.message)[:90] for w in caught if "AccumulateGrad" in str(w.message)]
    print(f"PROBE compile={compile_mode} precision={precision} accumulategrad={len(hits)}")
    assert not hits
