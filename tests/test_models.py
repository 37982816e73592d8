"""models.py: the networks, the one each dataset trains, and the seed CNN's first convolution
as torch.compile sees it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from accelbench.data.datasets import DATASETS
from accelbench.training.models import LeNet, SeedCNN, conv2d_one_channel, for_dataset


def _conv_and_copies() -> tuple[torch.nn.Conv2d, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(1, 32, 3)
    weight = conv.weight.detach().clone().requires_grad_()
    bias = conv.bias.detach().clone().requires_grad_()
    return conv, weight, bias


def test_one_channel_convolution_is_the_convolution_forward_and_backward() -> None:
    conv, weight, bias = _conv_and_copies()
    images = torch.randn(4, 1, 28, 28)
    expected = conv(images)
    got = conv2d_one_channel(images, weight, bias)
    assert got.shape == expected.shape == (4, 32, 26, 26)
    assert got.is_contiguous(memory_format=torch.channels_last)  # the GEMM's rows are pixels
    torch.testing.assert_close(got, expected)
    upstream = torch.randn_like(expected)
    expected.backward(upstream)
    got.backward(upstream)
    torch.testing.assert_close(weight.grad, conv.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(bias.grad, conv.bias.grad, rtol=1e-4, atol=1e-4)


def test_under_autocast_it_computes_in_the_autocast_dtype_as_the_convolution_does() -> None:
    conv, weight, bias = _conv_and_copies()
    images = torch.randn(2, 1, 28, 28)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = conv(images), conv2d_one_channel(images, weight, bias)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=0.02, atol=0.02)


def test_compiled_seed_cnn_runs_one_convolution_and_computes_what_the_eager_one_does() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def recording_backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    torch.manual_seed(0)
    model = SeedCNN(dropout=0.0).eval()
    images = torch.randn(8, 1, 28, 28)
    compiled = torch.compile(model, backend=recording_backend, fullgraph=True)
    torch.testing.assert_close(compiled(images), model(images))
    convolutions = [
        node.target
        for graph in graphs
        for node in graph.graph.nodes
        if node.op == "call_function" and node.target in (F.conv2d, torch.conv2d)
    ]
    assert len(convolutions) == 1  # conv2; conv1 became multiply-adds


def test_each_dataset_trains_its_own_model_and_a_new_one_needs_one() -> None:
    mnist, cifar10 = DATASETS["mnist"], DATASETS["cifar10"]
    assert isinstance(for_dataset(mnist), SeedCNN) and isinstance(for_dataset(cifar10), LeNet)
    assert for_dataset(mnist, dropout=0.1).features[5].p == 0.1
    for dataset in (mnist, cifar10):
        images = torch.zeros(2, *dataset.input_shape)
        assert for_dataset(dataset)(images).shape == (2, 10)
    with pytest.raises(ValueError, match="no model for dataset 'svhn'"):
        for_dataset(replace(cifar10, name="svhn"))
