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
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import ConfigDict, Field, Strict, model_validator
from torch import nn

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
from accelbench.training.step import (
    CAPTURE_WARMUP_STEPS,
    DDP_CAPTURE_WARMUP_STEPS,
    TrainStep,
    autocast,
    wrap_ddp,
)


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


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)  # seeds CPU and every CUDA device


def configure_backends(variant: VariantParams, deterministic: bool = False) -> None:
    """Threads, TF32, cuDNN autotuning and, on request, deterministic algorithms (which also
    need CUBLAS_WORKSPACE_CONFIG, set by the CLI before CUDA starts: `request_determinism`)."""
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
    return EvalPass(
        loss=loss_sum.item() / len(target),
        accuracy=(predicted == target).double().mean().item(),
        predictions=predicted,
        targets=target,
        time_s=elapsed,
    )


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


@dataclass(frozen=True)
class FitHooks:
    """What `fit` calls out to, all optional.

    The energy counters are cumulative (joules), read at the clock's synchronized epoch
    boundaries. `phase` wraps the parts outside the timed epochs ("step_setup", "evaluation")
    so that a caller can time them (the train stage's phases).
    """

    on_step: Callable[[int], None] | None = None  # after each step, with its samples
    on_epoch: Callable[[EpochRecord], None] | None = None
    on_checkpoint: Callable[[TrainingState], None] | None = None  # after each epoch
    gpu_energy_j: Callable[[], float] | None = None  # the GPU board's counter (NVML)
    cpu_energy_j: Callable[[], float] | None = None  # the CPU packages' counter (RAPL)
    stopped_s: Callable[[], float] = lambda: 0.0  # seconds stopped so far (a Heartbeat)
    phase: Callable[[str], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


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
    with hooks.phase("step_setup"):
        step, scheduler = _make_step(model, spec, train_batches)
    first_epoch, records = 0, []
    if resume_from is not None:
        first_epoch, records = _restore(resume_from, model, step, scheduler)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    # Per-step losses stay on the device (one copy kernel a step, no host sync); the host
    # reads them once per epoch to sum them and to check for non-finite values.
    losses = torch.empty(len(train_batches), device=device)
    try:
        for epoch in range(first_epoch, recipe.epochs):
            model.train()
            stopped_from = hooks.stopped_s()  # outside the timed epoch: the heartbeat's lock
            batches = train_batches.epoch(epoch)
            totals = _train_epoch(step, scheduler, batches, losses, clock, hooks)
            stopped_s = hooks.stopped_s() - stopped_from
            check_nonfinite(totals.finite, epoch + 1, recipe.max_nonfinite_steps, variant)
            if spec.distributed:
                totals = _summed_over_processes(totals, device)
            # Eagerly: evaluation is not what is benchmarked, and compiling it
            # would recompile for eval mode and the test batch shapes.
            with hooks.phase("evaluation"):
                result = evaluate(model, test_batches, variant, device)
            record = totals.record(
                epoch + 1, result, device, warm_up=epoch == first_epoch, stopped_s=stopped_s
            )
            records.append(record)
            if hooks.on_epoch is not None:
                hooks.on_epoch(record)
            if hooks.on_checkpoint is not None:
                hooks.on_checkpoint(_training_state(epoch + 1, model, step, scheduler, records))
    finally:
        step.close()  # a graph holding DDP's collectives must not outlive training

    return records


def _make_step(
    model: nn.Module, spec: FitSpec, batches: Batches
) -> tuple[TrainStep, torch.optim.lr_scheduler.OneCycleLR | None]:
    """The step (DDP-wrapped as the spec says; TrainStep compiles) and its schedule."""
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
    return step, scheduler


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
    hooks: FitHooks,
) -> _EpochTotals:
    """One timed pass over the batches; the clock and the energy counters (GPU, CPU) are
    read only around it, after a synchronize: the counters outside the clock's interval, as
    an NVML energy read takes 2.4 ms (up to 17.5 ms; H100), 3% of a 0.08 s epoch
    (docs/results/2026-12-07-h100-stage-vs-bare.md); NVML's reads also outside RAPL's interval,
    as each keeps a core busy."""
    energy_j, cpu_energy_j, on_step = hooks.gpu_energy_j, hooks.cpu_energy_j, hooks.on_step
    optimizer, steps = step.optimizer, len(losses)
    sizes: list[int] = []
    data_wait_s = 0.0
    batches = iter(batches)
    clock.synchronize()  # the evaluation's kernels: not this epoch's energy
    energy_start = energy_j() if energy_j else None
    cpu_energy_start = cpu_energy_j() if cpu_energy_j else None
    start = clock.now()
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
    cpu_energy = cpu_energy_j() - cpu_energy_start if cpu_energy_j else None
    energy = energy_j() - energy_start if energy_j else None
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
    """What `fit` needs to go on after `epochs_done` epochs as if never interrupted (a
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
    epochs_done: int, model: nn.Module, step: TrainStep, scheduler: Any, records: list[EpochRecord]
) -> TrainingState:
    return TrainingState(
        epochs_done=epochs_done,
        model=model.state_dict(),
        optimizer=step.optimizer.state_dict(),
        scheduler=scheduler.state_dict() if scheduler is not None else None,
        scaler=step.scaler.state_dict(),
        rng_cpu=torch.get_rng_state(),
        rng_cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        records=list(records),
    )


def _restore(
    state: TrainingState, model: nn.Module, step: TrainStep, scheduler: Any
) -> tuple[int, list[EpochRecord]]:
    model.load_state_dict(state.model)
    step.optimizer.load_state_dict(state.optimizer)
    if scheduler is not None and state.scheduler is not None:
        scheduler.load_state_dict(state.scheduler)
    step.scaler.load_state_dict(state.scaler)
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
