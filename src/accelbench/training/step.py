"""The training step of one batch (`TrainStep`: augmentation, loss, backward, optimizer;
compiled and replayed as one CUDA graph where the variant asks) and DDP (`wrap_ddp`).
`compile_cache` keys a compiled variant's graphs by this module's code.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from accelbench.core.params import VariantParams

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(variant: VariantParams, device: torch.device) -> contextlib.AbstractContextManager:
    if variant.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[variant.precision])


def random_shift(images: torch.Tensor, max_px: int, fill: float) -> torch.Tensor:
    """Translate each image by its own random offset in [-max_px, max_px] pixels.

    One gather on the device, so it runs inside a captured graph and costs little next to
    the convolutions; uncovered pixels get `fill` (the normalized background value).
    """
    n, channels, height, width = images.shape
    padded = F.pad(images, (max_px,) * 4, value=fill)
    offsets = torch.randint(0, 2 * max_px + 1, (2, n, 1), device=images.device)
    rows = (offsets[0] + torch.arange(height, device=images.device))[:, :, None]
    cols = (offsets[1] + torch.arange(width, device=images.device))[:, None, :]
    batch = torch.arange(n, device=images.device)[:, None, None]
    if channels == 1:
        return padded[batch, 0, rows, cols].unsqueeze(1)
    # the same offset for every channel of an image: [n, h, w, c] back to [n, c, h, w]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)


CAPTURE_WARMUP_STEPS = 3  # eager steps before capture: compilation, autotuning, Adam state
# PyTorch's CUDA semantics notes ("Usage with DistributedDataParallel"): whole-step capture
# of a DDP step needs NCCL >= 2.9.6, DDP built on a side stream and at least 11 eager
# DDP steps before capture (DDP rebuilds its buckets and samples runtime stats early on).
DDP_CAPTURE_WARMUP_STEPS = 11


@contextlib.contextmanager
def side_stream(device: torch.device) -> Iterator[torch.cuda.Stream]:
    """Run the body on a new CUDA stream that starts after, and rejoins, the current one."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield stream
    torch.cuda.current_stream(device).wait_stream(stream)


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (images, labels) -> loss


class TrainStep:
    """One optimizer step; with `cuda_graph`, the whole step is captured once and replayed.

    A replayed graph launches forward, backward and the optimizer as one unit, removing the
    per-kernel launch gaps that dominate a step of this small CNN on a fast GPU. Capture
    needs warm-up steps; they are undone (weights restored, optimizer state zeroed) so every
    variant starts training from the same state. Under DistributedDataParallel the graph
    also holds DDP's gradient all-reduce (NCCL collectives can be captured).

    `model` is the module trained (the plain module, or its DDP wrapper). With `compile`, the
    whole loss (augmentation, forward pass and cross-entropy, under autocast) is compiled as
    one function, so Inductor fuses the augmentation and the loss into its kernels (under
    DDP, Dynamo splits it at DDP's forward into three graphs; the results are the same).
    Batches of another size than the first (an epoch's partial last one) run eagerly, so a
    compiled variant never compiles the partial batch's shapes inside its timed epoch.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        variant: VariantParams,
        device: torch.device,
        *,
        shift_px: int,
        fill: float,
        accumulation_steps: int = 1,
        warmup_steps: int = CAPTURE_WARMUP_STEPS,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        # `fill`: the augmentation's padding, a normalized black pixel. `stream`: where every
        # step runs: the one a captured DDP module was built on, so that autograd's gradient
        # accumulators, which DDP holds from its construction, see one stream.
        self.model, self.shift_px, self.fill = model, shift_px, fill
        self.stream, self.warmup_steps = stream, warmup_steps
        self.ddp = isinstance(model, DistributedDataParallel)
        self.accumulation_steps = accumulation_steps
        self.optimizer, self.variant, self.device = optimizer, variant, device
        self.scaler = torch.amp.GradScaler(device.type, enabled=variant.precision == "fp16")
        self.skipped_steps = torch.zeros((), dtype=torch.int64, device=device)
        self.full_shape: torch.Size | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.full_batch_loss = self._loss  # the full batches' loss, compiled if asked
        if variant.compile != "none":
            # torch.compile takes a mode or options, not both: options only for 'default'
            tuning = {"mode": variant.compile}
            if variant.compile == "default":
                tuning = {"options": {"triton.autotune_pointwise": variant.kernel_autotune}}
            self.full_batch_loss = torch.compile(self._loss, dynamic=False, **tuning)

    def augment(self, images: torch.Tensor) -> torch.Tensor:
        if not self.shift_px:
            return images
        shifted = random_shift(images, self.shift_px, fill=self.fill)
        if self.variant.channels_last:
            shifted = shifted.contiguous(memory_format=torch.channels_last)
        return shifted

    def _run(
        self, images: torch.Tensor, labels: torch.Tensor, loss_fn: LossFn | None = None
    ) -> torch.Tensor:
        """Forward, backward and optimizer step, uncaptured (the compiled loss, or `loss_fn`)."""
        loss_fn = loss_fn or self.full_batch_loss
        if self.accumulation_steps == 1:
            loss = loss_fn(images, labels)
            self.scaler.scale(loss).backward()
            return self._optimizer_step(loss.detach().float())
        total = len(labels)
        loss = torch.zeros((), device=images.device)
        # Gradient accumulation: the batch in chunks, each loss weighted by its share of the
        # batch, so the update equals one pass over the whole batch (with less memory).
        parts = self.accumulation_steps
        split = zip(images.tensor_split(parts), labels.tensor_split(parts), strict=True)
        chunks = [(chunk, chunk_labels) for chunk, chunk_labels in split if len(chunk_labels)]
        for i, (chunk, chunk_labels) in enumerate(chunks):
            # Under DDP only the last chunk's backward all-reduces (the accumulated gradients):
            # one collective per step on every process, however its shard was chunked.
            last = i == len(chunks) - 1
            with contextlib.nullcontext() if last or not self.ddp else self.model.no_sync():
                chunk_loss = loss_fn(chunk, chunk_labels)
                share = len(chunk_labels) / total
                self.scaler.scale(chunk_loss * share).backward()
            loss = loss + chunk_loss.detach().float() * share
        return self._optimizer_step(loss)

    def _loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with autocast(self.variant, self.device):
            return F.cross_entropy(self.model(self.augment(images)), labels)

    def _optimizer_step(self, loss: torch.Tensor) -> torch.Tensor:
        self.scaler.step(self.optimizer)
        if self.scaler.is_enabled():
            # GradScaler skips a step with inf/NaN gradients and lowers its scale; count those
            # on the device (the public get_scale() would synchronize every step).
            before = self.scaler._scale.clone()
            self.scaler.update()
            self.skipped_steps += (self.scaler._scale < before).long()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _capture(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        optimizer_state = {  # empty for a fresh optimizer, filled when resuming
            param: {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
            for param, state in self.optimizer.state.items()
        }
        static_images, static_labels = images.clone(), labels.clone()
        warmup = contextlib.nullcontext() if self.stream else side_stream(self.device)
        with warmup:  # off the default stream, as capture needs
            for _ in range(self.warmup_steps):  # compilation, autotuning, optimizer state
                self._run(static_images, static_labels)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            static_loss = self.full_batch_loss(static_images, static_labels)
            static_loss.backward()
            self.optimizer.step()
        # Undo the warm-up: same starting point as an eager run (copies keep the addresses
        # the graph captured).
        self.model.load_state_dict(weights)
        for param, state in self.optimizer.state.items():
            saved = optimizer_state.get(param)
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    value.copy_(saved[key]) if saved else value.zero_()
        self.graph = graph
        # Detached: the captured loss's autograd graph (its gradient accumulators made on the
        # capture stream) is freed, so an eager partial batch on another stream builds its
        # own, and autograd's "AccumulateGrad node's stream does not match" stays silent.
        self.static = (static_images, static_labels, static_loss.detach())

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.stream is None:
            return self._step(images, labels)
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # the batch was gathered on the current stream
        with torch.cuda.stream(self.stream):
            loss = self._step(images, labels)
        current.wait_stream(self.stream)
        return loss

    def close(self) -> None:
        """Free the captured graph and its memory pool. Under DDP the graph holds NCCL
        collectives, which keep the communicator in use until the graph is gone."""
        if self.graph is not None:
            self.graph.reset()
        self.graph = self.static = None

    def _step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.full_shape is None:
            self.full_shape = images.shape
        if images.shape != self.full_shape:
            self.optimizer.zero_grad(set_to_none=True)  # never add into a graph's gradients
            return self._run(images, labels, self._loss)  # eager: a partial batch
        if not self.variant.cuda_graph or self.accumulation_steps > 1:
            return self._run(images, labels)  # a graph captures one pass per step
        if self.graph is None:
            self._capture(images, labels)
        static_images, static_labels, static_loss = self.static
        static_images.copy_(images)
        static_labels.copy_(labels)
        self.graph.replay()
        return static_loss.float()


# DDP's "Grad strides do not match bucket view strides" is about conv1's [32, 1, 3, 3]
# weight in channels_last: its gradient's strides differ only in the size-1 input-channel
# dimension, as cuDNN chooses; the memory order is the same, so the reducer's copy is a plain
# one and the slowdown the warning names does not arise. Other layout warnings still show.
warnings.filterwarnings(
    "ignore", message="Grad strides do not match bucket view strides", category=UserWarning
)


def wrap_ddp(
    model: nn.Module, device: torch.device, stream: torch.cuda.Stream | None = None
) -> DistributedDataParallel:
    """DistributedDataParallel around `model`, built on `stream` when its steps will run there
    (a captured step: see `TrainStep`)."""
    device_ids = [device.index] if device.type == "cuda" else None
    if stream is None:
        return DistributedDataParallel(model, device_ids=device_ids)
    with torch.cuda.stream(stream):
        return DistributedDataParallel(model, device_ids=device_ids)
