"""The models, and which one each dataset is trained with (`for_dataset`)."""

from __future__ import annotations

import torch
from torch import nn

from accelbench.data.datasets import Dataset


def one_channel_taps(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """A 1-input-channel convolution's k*k taps: (input shifted by the tap [N, 1, H, W], the
    tap's weights [C, 1]) each, and the bias; under autocast, in the autocast dtype (as the
    convolution computes). Stride 1, no padding."""
    if x.shape[1] != 1 or weight.shape[1] != 1:
        raise ValueError(
            f"one input channel only: input {tuple(x.shape)}, weight {tuple(weight.shape)}"
        )
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
    kernel_h, kernel_w = weight.shape[-2:]
    out_h, out_w = x.shape[-2] - kernel_h + 1, x.shape[-1] - kernel_w + 1
    taps = [
        (x[:, :, i : i + out_h, j : j + out_w], weight[:, :, i, j])
        for i in range(kernel_h)
        for j in range(kernel_w)
    ]
    return taps, bias


def conv2d_one_channel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`F.conv2d(x, weight, bias)` for one input channel (stride 1, no padding), written as
    one GEMM: the k*k shifted inputs (patches [N, H, W, k*k]) times the weights [k*k, C].

    The same function; only the kernels differ. cuDNN runs a 1-channel convolution on a
    non-tensor-core engine and converts layouts around its weight gradient; as a GEMM, its
    forward and backward are matmuls, which also leaves Inductor no reduction to generate
    (docs/results/2026-12-05-h200-cold-compile.md). In a 16-bit dtype K is padded with zero
    taps to 16, the multiple tensor cores take. Under autocast it computes in the autocast
    dtype, as the convolution would; its output is channels-last in memory.
    """
    taps, bias = one_channel_taps(x, weight, bias)
    shifted = [tap_input[:, 0] for tap_input, _ in taps]
    weights = torch.cat([tap for _, tap in taps], dim=1)  # [C, k*k]
    pad = -len(taps) % 16 if weights.element_size() == 2 else 0
    patches = torch.stack(shifted + [torch.zeros_like(shifted[0])] * pad, dim=-1)
    weights = nn.functional.pad(weights, (0, pad))
    return (patches @ weights.t() + bias).permute(0, 3, 1, 2)  # [N, H, W, C] as NCHW


class SeedCNN(nn.Module):
    """The tutorials' MNIST CNN: two 3x3 convolutions, max-pool, Dropout2d, one linear layer.
    About 21.8 MFLOP per sample forward, 97% of it in conv2."""

    def __init__(self, dropout: float = 0.25) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, kernel_size=3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Dropout2d(dropout),
        )
        self.classifier = nn.Linear(64 * 12 * 12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = iter(self.features)
        # Eager runs and FX tracing (int8) keep the nn.Conv2d; torch.export (and exporters
        # built on it) counts as compiling, and exports the GEMM.
        if torch.compiler.is_compiling():
            conv1 = next(layers)
            x = conv2d_one_channel(x, conv1.weight, conv1.bias)
        for layer in layers:
            x = layer(x)
        return self.classifier(torch.flatten(x, 1))


class LeNet(nn.Module):
    """The DDP/AMP tutorial's CIFAR-10 `Net`: LeNet-5 with max-pooling and ReLU, no dropout
    (the tutorial's has none). About 1.3 MFLOP per sample forward, 54% of it in conv1."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
            nn.Linear(84, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def for_dataset(dataset: Dataset, dropout: float | None = None) -> nn.Module:
    """The model `dataset` is trained with: the seed CNN on MNIST, LeNet on CIFAR-10.
    `dropout` is the seed CNN's (None: its default); LeNet has none."""
    if dataset.name == "mnist":
        return SeedCNN() if dropout is None else SeedCNN(dropout)
    if dataset.name == "cifar10":
        return LeNet()
    raise ValueError(f"no model for dataset {dataset.name!r}: add one to training/models.py")
