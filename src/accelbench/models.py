"""Model definitions only."""

from __future__ import annotations

import torch
from torch import nn


class SeedCNN(nn.Module):
    """The tutorials' MNIST CNN: two 3x3 convolutions, max-pool, Dropout2d, one linear layer.

    Conv2d(1,32,3) -> ReLU -> Conv2d(32,64,3) -> ReLU -> MaxPool2d(2) -> Dropout2d(0.25)
    -> Flatten -> Linear(9216, 10). About 21.8 MFLOP per sample forward, 97% of it in conv2.
    """

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
        return self.classifier(torch.flatten(self.features(x), 1))
