"""Train and evaluate, returning numbers: no logging, no files, no MLflow, no phases.

Honest timing rules, kept here: no host synchronization inside the step loop (losses and
non-finite counts accumulate on the device); the clock is read, after a synchronize, only
at epoch boundaries; evaluation runs outside the timed training region. What a caller
wants to know or time along the way (steps, epochs, the parts outside the timed epochs),
`fit` hands to its `FitHooks`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import resource
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import ConfigDict, Field, Strict, model_validator
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from accelbench.core.console import AccelbenchError
from accelbench.core.params import TrainRecipe, VariantParams
from accelbench.core.results import (
    RECORD,
    EpochRecord,
    RunFigures,
    energy_read,
    record,
    steady_epochs,
)
from accelbench.core.timing import DeviceClock
from accelbench.data.batches import Batch, Batches, zero_pixel

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class EvalPass:
    """One pass of a model over test batches: the loss, the accuracy, every prediction."""

    loss: float
    accuracy: float
    predictions: torch.Tensor  # int64 CPU
    targets: torch.Tensor  # int64 CPU
    time_s: float

    @property
    def samples_per_s(self) -> float:
        return len(self.targets) / self.time_s if self.time_s > 0 else math.nan


def autocast(variant: VariantParams, device: torch.device) -> contextlib.AbstractContextManager:
    if variant.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[variant.precision])


def train_flops_per_sample(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """FLOPs of one forward + backward pass for one sample of `input_shape` (channels, height,
    width), counted by PyTorch's FlopCounter on a copy of `model`; the random generators are
    left as they were (the probe's dropout draws from them)."""
    probe = copy.deepcopy(model).to("cpu").float().train()
    x = torch.zeros((2, *input_shape))
    from torch.utils.flop_counter import FlopCounterMode  # once per model (build's cache)

    with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as counter:
        F.cross_entropy(probe(x), torch.zeros(2, dtype=torch.long)).backward()
    return counter.get_total_flops() // 2


def peak_host_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)  # seeds CPU and every CUDA device


def configure_backends(variant: VariantParams, deterministic: bool = False) -> None:
    """Threads, TF32, cuDNN autotuning and, on request, deterministic algorithms.

    Deterministic mode also needs CUBLAS_WORKSPACE_CONFIG before CUDA starts: the CLI sets it
    (`request_determinism`) before anything touches the GPU.
    """
    if variant.threads is not None:
        torch.set_num_threads(variant.threads)
    if variant.uses_cuda:
        torch.backends.cudnn.benchmark = variant.cudnn_benchmark and not deterministic
        torch.backends.cuda.matmul.allow_tf32 = variant.tf32
        torch.backends.cudnn.allow_tf32 = variant.tf32
    torch.backends.cudnn.deterministic = deterministic
    if deterministic or torch.are_deterministic_algorithms_enabled():  # else: costs 2 s
        # warn_only: an op without a deterministic kernel warns (naming itself), not fails
        torch.use_deterministic_algorithms(deterministic, warn_only=True)


def start_device(device: torch.device) -> None:
    """Create the CUDA context now (else the first tensor on the device pays for it)."""
    if device.type == "cuda":
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)


def request_determinism(environ: dict[str, str]) -> None:
    """cuBLAS is deterministic only with a fixed workspace, chosen before CUDA initializes."""
    environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def make_optimizer(
    model: nn.Module, recipe: TrainRecipe, variant: VariantParams, device: torch.device
) -> torch.optim.Optimizer:
    fused = True if variant.fused_optimizer else None
    if variant.cuda_graph:
        # Captured in a graph: the step count and the learning rate must live on the device,
        # so the schedule can change the rate between replays.
        lr = torch.tensor(recipe.lr, device=device)
        return torch.optim.Adam(model.parameters(), lr=lr, fused=fused, capturable=True)
    return torch.optim.Adam(model.parameters(), lr=recipe.lr, fused=fused)


def make_scheduler(
    optimizer: torch.optim.Optimizer, recipe: TrainRecipe, steps_per_epoch: int
) -> torch.optim.lr_scheduler.OneCycleLR | None:
    if recipe.schedule == "constant":
        return None
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=recipe.lr * recipe.onecycle_max_lr_factor,
        total_steps=recipe.epochs * steps_per_epoch + 1,  # +1: the last step must not wrap
        pct_start=recipe.onecycle_pct_start,
        anneal_strategy="cos",
        # Adam's betas stay fixed: cycling them changes the recipe, and a captured CUDA graph
        # bakes Python-float hyperparameters in at capture time (the rate is a device tensor).
        cycle_momentum=False,
    )


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Batches,
    variant: VariantParams,
    device: torch.device,
    max_batches: int | None = None,
) -> EvalPass:
    """Test loss (summed, then divided by the sample count), accuracy and predictions (of the
    first `max_batches` batches only, when given: a warm-up)."""
    clock = DeviceClock(device)
    model.eval()
    loss_sum = torch.zeros((), device=device)
    predictions, targets = [], []
    start = clock.now()
    for i, (images, labels) in enumerate(batches.epoch(0)):
        if max_batches is not None and i >= max_batches:
            break
        with autocast(variant, device):
            logits = model(images)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum")
        predictions.append(logits.argmax(dim=1))
        targets.append(labels)
    elapsed = clock.now() - start
    predicted = torch.cat(predictions).cpu()
    target = torch.cat(targets).cpu()
    n = len(target)
    return EvalPass(
        loss=loss_sum.item() / n,
        accuracy=(predicted == target).double().mean().item(),
        predictions=predicted,
        targets=target,
        time_s=elapsed,
    )


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
    whole loss (augmentation, forward pass and cross-entropy, under autocast) goes through
    torch.compile as one function, so Inductor fuses the augmentation's gather and layout
    change and the loss into its kernels (the model alone left them as separate eager
    kernels in every step). Under DDP, Dynamo splits it at DDP's forward into three graphs
    (augmentation, the model under DDPOptimizer, the loss); the results are the same.
    Batches of another size than the first (the last, partial one of an epoch) run eagerly,
    so a compiled variant compiles the full batch's shapes only (one per chunk size with
    gradient accumulation), not the partial batch's inside its timed epoch.
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
        # `fill`: the augmentation's padding, a normalized black pixel (a constant to
        # torch.compile). `stream`: where every step runs (warm-up, capture, replays, partial
        # batches): the stream a captured DDP module was built on, so that autograd's
        # gradient accumulators, which DDP holds from its construction, see one stream.
        self.model, self.shift_px, self.fill = model, shift_px, fill
        self.stream = stream
        self.warmup_steps = warmup_steps
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
            mode = None if variant.compile == "default" else variant.compile
            self.full_batch_loss = torch.compile(self._loss, mode=mode, dynamic=False)

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
        chunks = [
            (chunk, chunk_labels)
            for chunk, chunk_labels in zip(
                images.tensor_split(self.accumulation_steps),
                labels.tensor_split(self.accumulation_steps),
                strict=True,
            )
            if len(chunk_labels)
        ]
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


# DDP's "Grad strides do not match bucket view strides" (once per process) is about conv1's
# [32, 1, 3, 3] weight in channels_last: its gradient's strides differ from the parameter's
# in the stride of the size-1 input-channel dimension alone, which cuDNN sets as its
# algorithm chooses. The memory order is the same, so the reducer's copy into the bucket is
# a plain one: the "may impair performance" the warning names (the reducer's source: "The
# penalty for disobedience is reduced performance, not numerical death") does not arise.
# Other layout warnings still show.
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


class NonFiniteLossError(AccelbenchError, RuntimeError):
    """Training produced non-finite losses for too many consecutive steps."""


def check_nonfinite(finite: torch.Tensor, epoch: int, limit: int, variant: VariantParams) -> None:
    """Fail when `limit` consecutive steps of this epoch had a non-finite loss."""
    streak = 0
    for step, ok in enumerate(finite.tolist(), start=1):
        streak = 0 if ok else streak + 1
        if streak >= limit:
            advice = (
                "try precision 'bf16' (no fp16 overflow) or a lower train.lr"
                if variant.precision == "fp16"
                else "try a lower train.lr (or train.schedule: constant)"
            )
            raise NonFiniteLossError(
                f"epoch {epoch}, step {step}: {limit} consecutive non-finite losses "
                f"(train.max_nonfinite_steps = {limit}); {advice}"
            )


@dataclass(frozen=True)
class FitSpec:
    """What `fit` trains with: the part of a training job the engine reads."""

    recipe: TrainRecipe
    variant: VariantParams
    device: torch.device
    # every batch in this many forward/backward passes (the same update, less memory)
    accumulation_steps: int = 1
    # under DistributedDataParallel, in the process group this process has joined
    distributed: bool = False


def _untimed() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def _never_stopped() -> float:
    return 0.0


@dataclass(frozen=True)
class FitHooks:
    """What `fit` calls out to, all optional.

    The energy counters are cumulative (joules), read at the same synchronized epoch
    boundaries as the clock. `around_step_setup` and `around_evaluation` wrap the parts of
    a fit outside its timed epochs (building the step; each epoch's evaluation), so that a
    caller can time them: loop.py records them as phases.
    """

    on_step: Callable[[int], None] | None = None  # after each step, with its samples
    on_epoch: Callable[[EpochRecord], None] | None = None
    on_checkpoint: Callable[[TrainingState], None] | None = None  # after each epoch
    gpu_energy_j: Callable[[], float] | None = None  # the GPU board's counter (NVML)
    cpu_energy_j: Callable[[], float] | None = None  # the CPU packages' counter (RAPL)
    stopped_s: Callable[[], float] = _never_stopped  # seconds stopped so far (a Heartbeat)
    around_step_setup: Callable[[], contextlib.AbstractContextManager[None]] = _untimed
    around_evaluation: Callable[[], contextlib.AbstractContextManager[None]] = _untimed


def fit(
    model: nn.Module,
    train_batches: Batches,
    test_batches: Batches,
    spec: FitSpec,
    hooks: FitHooks = FitHooks(),
    resume_from: TrainingState | None = None,
) -> list[EpochRecord]:
    """Train for `spec.recipe.epochs` epochs; evaluate on the test set after each (untimed).

    Under `spec.distributed`, each epoch's figures are summed over the processes.
    `hooks.on_checkpoint` receives the complete training state after every epoch;
    `resume_from` (such a state) continues from it, so that an interrupted and resumed run
    ends with the same weights as an uninterrupted one.
    """
    recipe, variant, device = spec.recipe, spec.variant, spec.device
    clock = DeviceClock(device)
    with hooks.around_step_setup():
        step, optimizer, scheduler = _make_step(model, spec, train_batches)
    records: list[EpochRecord] = []
    first_epoch = 0
    if resume_from is not None:
        first_epoch, records = _restore(resume_from, model, optimizer, scheduler, step.scaler)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    # Per-step losses stay on the device (one copy kernel a step, no host sync); the host
    # reads them once per epoch to sum them and to check for non-finite values.
    losses = torch.empty(len(train_batches), device=device)
    try:
        for epoch in range(first_epoch, recipe.epochs):
            model.train()
            stopped_from = hooks.stopped_s()  # outside the timed epoch: the heartbeat's lock
            energy = (hooks.gpu_energy_j, hooks.cpu_energy_j)
            batches = train_batches.epoch(epoch)
            totals = _train_epoch(step, scheduler, batches, losses, clock, energy, hooks.on_step)
            stopped_s = hooks.stopped_s() - stopped_from
            check_nonfinite(totals.finite, epoch + 1, recipe.max_nonfinite_steps, variant)
            if spec.distributed:
                totals = _summed_over_processes(totals, device)
            # Eagerly: evaluation is not what is benchmarked, and compiling it
            # would recompile for eval mode and the test batch shapes.
            with hooks.around_evaluation():
                result = evaluate(model, test_batches, variant, device)
            record = totals.record(
                epoch + 1, result, device, warm_up=epoch == first_epoch, stopped_s=stopped_s
            )
            records.append(record)
            if hooks.on_epoch is not None:
                hooks.on_epoch(record)
            if hooks.on_checkpoint is not None:
                state = _training_state(
                    epoch + 1, model, optimizer, scheduler, step.scaler, records
                )
                hooks.on_checkpoint(state)
    finally:
        step.close()  # a graph holding DDP's collectives must not outlive training

    return records


def _make_step(
    model: nn.Module, spec: FitSpec, batches: Batches
) -> tuple[TrainStep, torch.optim.Optimizer, torch.optim.lr_scheduler.OneCycleLR | None]:
    """The step (DDP-wrapped as the spec says; TrainStep compiles), its optimizer and
    schedule."""
    recipe, variant, device = spec.recipe, spec.variant, spec.device
    trained = model
    stream = None
    if spec.distributed:
        # Gradients are averaged across processes in backward; every step must go through it.
        if variant.cuda_graph and device.type == "cuda":
            stream = torch.cuda.Stream(device)  # DDP's and every step's
        trained = wrap_ddp(model, device, stream)
    optimizer = make_optimizer(model, recipe, variant, device)
    scheduler = make_scheduler(optimizer, recipe, len(batches))
    step = TrainStep(
        trained,
        optimizer,
        variant,
        device,
        shift_px=recipe.shift_px,
        fill=zero_pixel(batches.dataset),
        accumulation_steps=spec.accumulation_steps,
        warmup_steps=DDP_CAPTURE_WARMUP_STEPS if spec.distributed else CAPTURE_WARMUP_STEPS,
        stream=stream,
    )
    return step, optimizer, scheduler


@dataclass(frozen=True)
class _EpochTotals:
    """One epoch's training figures, before evaluation (over this process, or all)."""

    finite: torch.Tensor  # per step: was the loss finite (bool, CPU)
    loss_sum: float  # sample-weighted, over the finite steps
    nonfinite: int
    samples: int
    train_time_s: float
    data_wait_s: float
    lr: float  # the rate the epoch's last step used
    energy_j: float | None
    scaler_skipped: int | None
    cpu_energy_j: float | None = None

    def record(
        self,
        epoch: int,
        result: EvalPass,
        device: torch.device,
        *,
        warm_up: bool,
        stopped_s: float,
    ) -> EpochRecord:
        return EpochRecord(
            epoch=epoch,
            train_loss=self.loss_sum / self.samples,  # over the finite steps
            train_time_s=self.train_time_s,
            data_wait_s=self.data_wait_s,
            samples=self.samples,
            samples_per_s=self.samples / self.train_time_s,
            test_loss=result.loss,
            test_accuracy=result.accuracy,
            nonfinite_steps=self.nonfinite,
            lr=self.lr,
            peak_gpu_mem_mib=(
                torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
            ),
            gpu_energy_j=self.energy_j,
            cpu_energy_j=self.cpu_energy_j,
            scaler_skipped_steps=self.scaler_skipped,
            stopped_s=stopped_s,
            warm_up=warm_up,
        )


def _train_epoch(
    step: TrainStep,
    scheduler: Any,
    batches: Iterator[Batch],
    losses: torch.Tensor,
    clock: DeviceClock,
    counters: tuple[Callable[[], float] | None, Callable[[], float] | None],
    on_step: Callable[[int], None] | None,
) -> _EpochTotals:
    """One timed pass over the batches; the clock and the energy counters (GPU, CPU) are
    read only around it, after a synchronize."""
    energy_j, cpu_energy_j = counters
    optimizer, steps = step.optimizer, len(losses)
    sizes: list[int] = []
    data_wait_s = 0.0
    batches = iter(batches)
    start = clock.now()
    energy_start = energy_j() if energy_j else None
    cpu_energy_start = cpu_energy_j() if cpu_energy_j else None
    lr = optimizer.param_groups[0]["lr"]
    while True:
        waited_from = time.perf_counter()
        batch = next(batches, None)
        data_wait_s += time.perf_counter() - waited_from
        if batch is None:
            break
        images, labels = batch
        losses[len(sizes)] = step(images, labels)
        if len(sizes) == steps - 1:  # the epoch's last step: record the rate it used
            lr = optimizer.param_groups[0]["lr"]
            lr = lr.clone() if isinstance(lr, torch.Tensor) else lr  # no host sync
        if scheduler is not None:
            scheduler.step()
        sizes.append(len(labels))
        if on_step is not None:
            on_step(len(labels))
    train_time_s = clock.now() - start
    energy = energy_j() - energy_start if energy_j else None
    cpu_energy = cpu_energy_j() - cpu_energy_start if cpu_energy_j else None
    step_losses = losses[: len(sizes)].double().cpu()
    finite = torch.isfinite(step_losses)
    weights = torch.tensor(sizes, dtype=torch.float64)
    skipped = None
    if step.scaler.is_enabled():
        skipped = int(step.skipped_steps.item())
        step.skipped_steps.zero_()
    return _EpochTotals(
        finite=finite,
        loss_sum=(step_losses[finite] * weights[finite]).sum().item(),
        nonfinite=int((~finite).sum()),
        samples=sum(sizes),
        train_time_s=train_time_s,
        data_wait_s=data_wait_s,
        lr=float(lr),
        energy_j=energy,
        scaler_skipped=skipped,
        cpu_energy_j=cpu_energy,
    )


def _summed_over_processes(totals: _EpochTotals, device: torch.device) -> _EpochTotals:
    """Epoch totals over every process (one collective per epoch)."""
    readings = [totals.energy_j or 0.0, totals.energy_j is not None]
    summed = torch.tensor(
        [totals.loss_sum, totals.nonfinite, totals.samples, *readings],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(summed)
    # Every process reads its own GPU's counter: the run's energy is their sum, and unknown
    # unless every process had a reading. The CPU packages' counter is the machine's, shared
    # by its processes: each keeps its own reading (rank 0's is recorded).
    complete = int(summed[4]) == dist.get_world_size()
    return replace(
        totals,
        loss_sum=summed[0].item(),
        nonfinite=int(summed[1]),
        samples=int(summed[2]),
        energy_j=summed[3].item() if complete else None,
    )


@record(frozen=True, config=RECORD | ConfigDict(arbitrary_types_allowed=True))
class TrainingState:
    """What `fit` needs to go on after `epochs_done` epochs as if never interrupted: the
    weights, the optimizer, schedule and scaler, the random generators, the epochs (a
    checkpoint holds it: checkpoint.py)."""

    epochs_done: Annotated[int, Strict(), Field(ge=1)]
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any] | None  # None: a constant learning rate
    scaler: dict[str, Any]
    rng_cpu: torch.Tensor
    rng_cuda: list[torch.Tensor] | None  # None: CUDA was not started
    records: list[EpochRecord]

    def to_dict(self) -> dict[str, Any]:
        """Tensors and plain types only: what `torch.load(weights_only=True)` reads back (not
        `asdict`, which would copy every tensor)."""
        own = {f.name: getattr(self, f.name) for f in fields(self)}
        return own | {"records": [r.as_dict() for r in self.records]}

    @model_validator(mode="after")
    def _a_record_per_epoch(self) -> TrainingState:
        if len(self.records) != self.epochs_done:
            raise ValueError(f"epochs_done {self.epochs_done} does not match its epoch records")
        return self


def _training_state(
    epochs_done: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.OneCycleLR | None,
    scaler: torch.amp.GradScaler,
    records: list[EpochRecord],
) -> TrainingState:
    return TrainingState(
        epochs_done=epochs_done,
        model=model.state_dict(),
        optimizer=optimizer.state_dict(),
        scheduler=scheduler.state_dict() if scheduler is not None else None,
        scaler=scaler.state_dict(),
        rng_cpu=torch.get_rng_state(),
        rng_cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        records=list(records),
    )


def _restore(
    state: TrainingState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.OneCycleLR | None,
    scaler: torch.amp.GradScaler,
) -> tuple[int, list[EpochRecord]]:
    model.load_state_dict(state.model)
    optimizer.load_state_dict(state.optimizer)
    if scheduler is not None and state.scheduler is not None:
        scheduler.load_state_dict(state.scheduler)
    scaler.load_state_dict(state.scaler)
    torch.set_rng_state(state.rng_cpu)
    if state.rng_cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state.rng_cuda)
    return state.epochs_done, list(state.records)


def summarize(records: list[EpochRecord], more_steady: Sequence[float] = ()) -> RunFigures:
    """Run-level figures: first epoch apart from the steady state (the median of
    `steady_epochs`: epochs 2..N less a resumed process's first, and of `more_steady`: the
    steady epochs of the timing repeats, `train.repeats`)."""
    times = [r.train_time_s for r in records]
    settled = steady_epochs(records)
    steady = [r.train_time_s for r in settled] + list(more_steady)
    steady_s = statistics.median(steady) if steady else None
    samples = records[-1].samples
    gpu_mem = [r.peak_gpu_mem_mib for r in records if r.peak_gpu_mem_mib is not None]
    return RunFigures(
        epochs=len(records),
        first_epoch_s=times[0],
        steady_epoch_s=steady_s,
        steady_epochs_s=steady,
        total_train_s=sum(times),
        steady_samples_per_s=samples / steady_s if steady_s else None,
        data_wait_fraction=sum(r.data_wait_s for r in records) / sum(times),
        final_train_loss=records[-1].train_loss,
        final_test_accuracy=records[-1].test_accuracy,
        best_test_accuracy=max(r.test_accuracy for r in records),
        nonfinite_steps=sum(r.nonfinite_steps for r in records),
        scaler_skipped_steps=(
            sum(r.scaler_skipped_steps for r in records)
            if records[0].scaler_skipped_steps is not None
            else None
        ),
        peak_gpu_mem_mib=max(gpu_mem) if gpu_mem else None,
        # A mean, not a median: NVML's counter advances in steps, so a short epoch reads one
        # step more or less than it used; over all steady epochs those errors cancel. Epochs
        # shorter than its steps can all read 0 J: that is no measurement (None, not 0).
        steady_gpu_energy_j_per_epoch=_steady_energy(records, settled, "gpu_energy_j"),
        steady_cpu_energy_j_per_epoch=_steady_energy(records, settled, "cpu_energy_j"),
    )


def _steady_energy(
    records: list[EpochRecord], settled: list[EpochRecord], counter: str
) -> float | None:
    """The mean reading of `counter` over the steady epochs, where it measured them."""
    if not settled or not energy_read(records, counter):
        return None
    return statistics.fmean(getattr(r, counter) for r in settled)
