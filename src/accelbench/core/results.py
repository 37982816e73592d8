"""What the stages hand each other: typed results with to/from JSON (their files: outputs.py).

train@V writes `train.json` (`TrainSummary`), `epochs.csv` and a `ModelFile`; evaluate@V
`eval.json` (`EvalSummary`); quantize@V `quantized.json` (`QuantizedSummary`); a variant not
run, `Skipped` (env's `EnvFacts`: env_facts.py). `read` reads them back into these strict
pydantic dataclasses: a renamed or retyped key fails where it is read, naming the file, the
key, the value and what is allowed, never later as an "n/a" in the report.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, field, fields
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.dataclasses import dataclass as record

from accelbench.core import phases
from accelbench.core.console import DISK_FULL_ERRNOS, InputError, first_sentence
from accelbench.core.outputs import a_file, atomic_path, write_json
from accelbench.core.problems import problems

# Strict scalars: a number is never text, a count never a fraction or a boolean.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]


def _fraction(value: float) -> float:
    if not 0 <= value <= 1:  # nan too
        raise ValueError("not a fraction in 0..1")
    return value


Fraction = Annotated[float, Strict(), AfterValidator(_fraction)]  # an accuracy
Status = Literal["trained", "skipped"]

# Strict per scalar, not per record: a strict record would refuse its nested records' JSON.
RECORD = ConfigDict(extra="forbid")
REDO = "re-run the stage that writes it"
_FLAT_IN_FILE = ("software", "gpu")  # nested records env_facts.py holds flat in the file

R = TypeVar("R")


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def check(cls: type[R], payload: Any) -> R:
    """`payload` (a file's JSON, a checkpoint's dict) as a `cls`; a ValueError lists every
    problem in one line."""
    try:
        return _adapter(cls).validate_python(payload)
    except ValidationError as exc:
        for error in (errors := exc.errors(include_url=False, include_context=False)):
            error["loc"] = tuple(p for p in error["loc"] if p not in _FLAT_IN_FILE)
        raise ValueError("; ".join(problems(errors, cls, _FLAT_IN_FILE))) from None


def parse(kind: type[R], payload: Any, source: str, redo: str = REDO) -> R:
    """`check`, with an InputError naming the file `source` and what to do. `kind`: a record,
    or a stage's result (`TrainResult`: `Skipped` where the payload's status says so)."""
    if isinstance(kind, UnionType):
        summary, skipped = get_args(kind)
        is_skipped = isinstance(payload, dict) and payload.get("status") == "skipped"
        kind = skipped if is_skipped else summary
    try:
        return check(kind, payload)
    except ValueError as exc:
        raise InputError(f"{source} is invalid: {exc}; {redo}") from None


def read(kind: type[R], path: Path, redo: str = REDO) -> R:
    """The JSON file at `path` as a `kind` (`parse`): the one way a stage's file is read back."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc}); {redo}") from None
    if not isinstance(payload, dict):
        raise InputError(f"{path}: not a results file; {redo}")
    return parse(kind, payload, str(path), redo)


class Record:
    """A stage file's record: read back with `parse`, written with `to_json`."""

    def to_json(self) -> dict[str, Any]:
        """The record as its file holds it (a key's alias, where it has one)."""
        return _adapter(type(self)).dump_python(self, by_alias=True)


@record(frozen=True, config=RECORD)
class Skipped(Record):
    """A variant this machine could not run (train.require_gpu false): recorded, not trained."""

    reason: Str
    device: Str | None = None
    status: Literal["skipped"] = "skipped"


@record(frozen=True, config=RECORD, kw_only=True)
class RunFigures(Record):
    """A training's run-level figures, from its epoch records alone (`engine.summarize`)."""

    epochs: Int  # a count
    first_epoch_s: Float
    steady_epoch_s: Float | None  # median of steady_epochs_s; None after one epoch
    total_train_s: Float
    steady_samples_per_s: Float | None
    data_wait_fraction: Float
    final_train_loss: Float
    final_test_accuracy: Fraction
    best_test_accuracy: Fraction
    nonfinite_steps: Int
    scaler_skipped_steps: Int | None  # fp16 + GradScaler only
    peak_gpu_mem_mib: Float | None
    steady_gpu_energy_j_per_epoch: Float | None
    steady_cpu_energy_j_per_epoch: Float | None = None  # RAPL, where readable
    # every steady epoch's seconds: epochs 2..N (less a resume's first), then each timing
    # repeat's (`train.repeats`); the report's intervals are drawn from them. None: an older file
    steady_epochs_s: list[Float] | None = None


@record(frozen=True, config=RECORD, kw_only=True)
class TrainSummary(RunFigures):
    """`train.json` of a trained variant: run-level figures, their units in their names."""

    accumulation_steps: Int  # as trained: an OOM retry may have raised it
    device: Str
    device_name: Str
    precision: Str
    batches: Str
    world_size: Int
    train_samples: Int
    flops_per_sample: Int
    steady_tflops: Float
    peak_tflops: Float | None  # the datasheet's, where the device is known
    peak_share: Float | None
    peak_host_rss_mib: Float
    steady_samples_per_s_per_process: Float | None
    compile_cache: Str | None = None  # the first epoch's: cold | warm | portable | partial
    repeats: Int = 1  # trainings: the run itself, and repeats - 1 more from scratch
    # each repeat's epochs as [seconds, test accuracy], repeat k at the run's seed + k
    repeat_epochs: list[list[list[Float]]] = field(default_factory=list)
    # the repeats' trainings, whole: a train stage's time to its model leaves them out, and
    # a torchrun launcher learns them only from rank 0's train.json
    repeats_wall_s: Float | None = None
    # what else used this host's GPUs or CPUs while it trained (`system/slots.py`); None: nothing
    shared_machine: Str | None = None
    status: Literal["trained"] = "trained"

    @property
    def timed_s(self) -> float:
        """Every timed epoch of the stage: the run's and its repeats' (the other seeds)."""
        return self.total_train_s + sum(
            epoch[0] for repeat in self.repeat_epochs for epoch in repeat
        )

    def metrics(self) -> dict[str, float | int | None]:
        """The numeric figures, for a tracker (`epochs` is a count, not a figure)."""
        return {
            k: v
            for k, v in asdict(self).items()
            if k != "epochs" and (v is None or isinstance(v, int | float))
        }


TrainResult = TrainSummary | Skipped  # read back with `read`, as each stage's result


def speedup(baseline: TrainResult | None, result: TrainResult) -> float | None:
    """How many times faster `result`'s steady epoch is than `baseline`'s (None where either
    did not train, or trained a single epoch)."""
    if not isinstance(baseline, TrainSummary) or not isinstance(result, TrainSummary):
        return None
    base, steady = baseline.steady_epoch_s, result.steady_epoch_s
    return base / steady if base and steady else None


def scaling_efficiency(speedup_over_one: float | None, world_size: int) -> float | None:
    """Speedup over one process / the number of processes (1.0: perfect scaling)."""
    return speedup_over_one / world_size if speedup_over_one else None


@record(frozen=True, config=RECORD | ConfigDict(populate_by_name=True))
class ClassScores(Record):
    precision: Float
    recall: Float
    f1_score: Float = Field(alias="f1-score")  # scikit-learn's name, in eval.json


@record(frozen=True, config=RECORD)
class EvalSummary(Record):
    """`eval.json` of a trained variant: the test set through its model; scores by digit."""

    test_accuracy: Fraction
    test_loss: Float
    macro_f1: Float
    inference_samples_per_s: Float
    per_class: dict[str, ClassScores]
    # what else used this host's GPUs or CPUs while it measured (`system/slots.py`); None: nothing
    shared_machine: Str | None = None
    status: Literal["trained"] = "trained"


EvalResult = EvalSummary | Skipped


@record(frozen=True, config=RECORD)
class RunRecord(Record):
    """`run.json`, from evaluate for compare: the variant's MLflow run (compare logs the
    evaluation there), or why there is none (a skipped variant)."""

    variant: Str
    status: Status
    mlflow_run_id: Str | None
    params: dict[str, Any] | None = None
    reason: Str | None = None


def write_per_class_csv(path: Path, result: EvalResult) -> None:
    """Precision, recall and F1 of each digit (DVC plots it; a skipped variant: the header)."""
    per_class = result.per_class if isinstance(result, EvalSummary) else {}
    with atomic_path(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["digit", "precision", "recall", "f1"])
        for digit, scores in sorted(per_class.items(), key=lambda item: int(item[0])):
            writer.writerow([digit, scores.precision, scores.recall, scores.f1_score])


QuantMethod = Literal["fp32", "dynamic_int8", "static_int8"]
QUANT_METHODS = get_args(QuantMethod)  # the quantize stage's, in order


@record(frozen=True, config=RECORD)
class InferenceFigures(Record):
    """One model (fp32 or quantized) on the CPU: accuracy, speed and size."""

    method: QuantMethod
    test_accuracy: Fraction
    latency_ms: Float  # batch 1: median over the repetitions
    samples_per_s: Float  # over the test set at the eval batch size
    size_bytes: Int


@record(frozen=True, config=RECORD)
class QuantizedSummary(Record):
    """`quantized.json`: the trained model on the CPU, each method's figures by its name; a
    method this torch build cannot run is in `unsupported` with the reason."""

    threads: Int  # CPU threads the figures were measured with
    batch_size: Int  # throughput's batch; latency is at batch 1
    latency_repeats: Int
    methods: dict[QuantMethod, InferenceFigures]
    unsupported: dict[QuantMethod, Str]  # method -> why not
    status: Literal["trained"] = "trained"

    @model_validator(mode="after")
    def _some_method(self) -> QuantizedSummary:
        if not self.methods and not self.unsupported:
            raise ValueError("methods and unsupported: both empty (expected some of "
                             f"{', '.join(QUANT_METHODS)})")  # fmt: skip
        return self

    def metrics(self) -> dict[str, float]:
        """Flat figures for a tracker: `quant_<method>_<figure>`."""
        return {
            f"quant_{method}_{key}": value
            for method, figures in self.methods.items()
            for key, value in asdict(figures).items()
            if isinstance(value, int | float)
        }


QuantizedResult = QuantizedSummary | Skipped


@record(frozen=True, config=RECORD)
class ModelFile:
    """`models/<variant>.pt`: the trained weights (CPU tensors) and the run's params
    (`{"variant": {...}, "train": {...}}`). A skipped variant's is JSON with the reason: no
    torch import to write or read it, so its stages return at once."""

    variant: Str
    status: Status
    mlflow_run_id: Str | None
    params: dict[str, Any] | None = None
    state_dict: dict[str, Any] | None = None
    reason: Str | None = None

    @model_validator(mode="after")
    def _weights_if_trained(self) -> ModelFile:
        if self.trained and (self.state_dict is None or self.params is None):
            raise ValueError("status 'trained' needs its weights (state_dict) and params")
        return self

    @property
    def trained(self) -> bool:
        return self.status == "trained"

    def save(self, path: Path) -> None:
        """torch.save (JSON without weights) atomically: a kill mid-save keeps the old file."""
        if self.state_dict is None and not self.trained:
            write_json(path, asdict(self))
        else:
            atomic_torch_save(asdict(self), path)

    @classmethod
    def load(cls, path: Path) -> ModelFile:
        """A model file (`weights_only`: never code); anything else: an InputError."""
        if not path.is_file():
            what = f"is {a_file(path)}" if path.exists() else "does not exist"
            what = "is a folder" if path.is_dir() else what
            raise InputError(f"{path}: {what}; expected a model file written by `accelbench train`")
        with path.open("rb") as handle:
            if handle.read(1) == b"{":  # a skipped variant's (torch.save writes a zip)
                return read(cls, path, "re-run train for it")
        not_ours = f"{path}: not a model file written by `accelbench train`"
        try:
            payload = load_torch(path)
        except ImportError:  # no torch here
            raise
        except Exception as exc:  # garbage, empty, truncated, pickled code: many types
            reason = first_sentence(exc, 100)
            raise InputError(f"{not_ours} ({reason}); re-run train for it") from None
        if not isinstance(payload, dict):
            raise InputError(f"{not_ours} (another structure); re-run train for it")
        return parse(cls, payload, str(path), "re-run train for it")


def load_torch(path: Path) -> Any:
    """What torch.save wrote to `path` (tensors and plain types only, never code)."""
    with phases.phase("imports"):
        import torch

    with warnings.catch_warnings():  # a foreign pickle's protocol warning: not news
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=True)


def atomic_torch_save(payload: Any, path: Path) -> None:
    """torch.save to a temporary, then rename; a failed save leaves the old file and no
    temporary. torch's zip writer reports a full disk as a RuntimeError ("unexpected pos")
    with the OSError behind it: that OSError is raised, naming the file."""
    import torch

    with atomic_path(path) as tmp:
        try:
            with tmp.open("wb") as handle:  # a file of ours: its OSError is torch's context
                torch.save(payload, handle)
        except (OSError, RuntimeError) as exc:
            cause = exc if isinstance(exc, OSError) else exc.__context__ or exc.__cause__
            if isinstance(cause, OSError) and cause.errno in DISK_FULL_ERRNOS:
                raise OSError(cause.errno, cause.strerror, str(path)) from exc
            raise


STOPPED_LIMIT_S, STOPPED_SHARE = 0.5, 0.05  # an epoch stopped longer is no steady one


@record(frozen=True, config=RECORD)
class EpochRecord:
    """One trained epoch: a row of `epochs.csv` (its columns, in this order), a step of the
    variant's MLflow metrics, and part of the checkpointed training state."""

    epoch: Int  # 1-based
    train_loss: Float
    train_time_s: Float
    data_wait_s: Float
    samples: Int
    samples_per_s: Float
    test_loss: Float
    test_accuracy: Float
    nonfinite_steps: Int
    lr: Float
    peak_gpu_mem_mib: Float | None
    gpu_energy_j: Float | None = None  # board energy during the timed training, from NVML
    cpu_energy_j: Float | None = None  # CPU packages' energy in the same window, from RAPL
    scaler_skipped_steps: Int | None = None  # fp16: steps GradScaler skipped (inf/NaN grads)
    # seconds not run in the timed epoch (`timing.Heartbeat`); over the STOPPED_ limits: unsteady
    stopped_s: Float = 0.0
    # its process's first (epoch 1, or a resume's first): paid for compilation; never steady
    warm_up: Bool = False

    @property
    def stopped(self) -> bool:
        """Stopped for a substantial part of it: what it measured is not the training."""
        return self.stopped_s > min(STOPPED_LIMIT_S, STOPPED_SHARE * self.train_time_s)

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)

    def metrics(self) -> dict[str, float | int | None]:
        """The epoch's figures as MLflow metrics (the warm-up mark is no figure)."""
        return {k: v for k, v in asdict(self).items() if k != "warm_up"}


def steady_epochs(records: Sequence[EpochRecord]) -> list[EpochRecord]:
    """One training's steady epochs: all but its processes' first (epoch 1, a resume's first),
    which compiled and captured graphs, and those the process was `stopped` in."""
    return [r for r in records[1:] if not (r.warm_up or r.stopped)]


def energy_read(records: Sequence[EpochRecord], counter: str) -> bool:
    """Whether an energy `counter` (`gpu_energy_j`, `cpu_energy_j`) measured a training's
    epochs: a reading for each, and its steady epochs' not all 0 J. NVML's counter advances
    in steps: epochs shorter than a step can all read 0 J, which is no measurement (the
    energy shows up in the next untimed gap, or in a resume's long warm-up epoch)."""
    readings = [getattr(r, counter) for r in records]
    if not readings or any(r is None or math.isnan(r) for r in readings):
        return False
    settled = steady_epochs(records)
    return not settled or any(getattr(r, counter) for r in settled)


def write_epochs_csv(path: Path, records: Sequence[EpochRecord]) -> None:
    """One row per epoch (DVC plots it); a skipped variant's file has the header `epoch`."""
    columns = [f.name for f in fields(EpochRecord)] if records else ["epoch"]
    with atomic_path(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(record.as_dict() for record in records)


def _cell(text: str | None) -> Any:
    """An epochs.csv cell as csv wrote its value: empty for None, True/False, a number."""
    if text in ("", "None"):
        return None
    if text in ("True", "False"):
        return text == "True"
    for number in (int, float):
        try:
            return number(text)
        except (TypeError, ValueError):
            pass
    return text


def read_epoch_records(path: Path) -> list[EpochRecord]:
    """`write_epochs_csv`'s records back."""
    with path.open() as handle:
        rows = [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(handle)]
    return [parse(EpochRecord, row, str(path), "re-run train") for row in rows]
