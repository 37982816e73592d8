"""accelbench: how much a GPU and mixed precision really speed up training a CNN on MNIST."""

__version__ = "0.1.0"
