"""What the stages hand each other: typed results with to/from JSON, and their file names.

env writes an `EnvFacts` to `env/<device>.json`; train@V a `TrainSummary` (or `Skipped`) to
`train.json`, its epochs to `epochs.csv` and a `ModelFile`; evaluate@V an `EvalSummary` (or
`Skipped`) to `eval.json`; quantize@V a `QuantizedSummary` (or `Skipped`) to
`quantized.json`. Compare, tracking and the benchmarks read them back through these types, so
a renamed field fails loudly where it is read instead of becoming an "n/a" in the report.
"""

from __future__ import annotations

import csv
import errno
import functools
import json
import math
import os
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from accelbench.core import phases
from accelbench.core.console import DISK_FULL_ERRNOS, InputError, echo, first_sentence

TRAIN_JSON = "train.json"
EPOCHS_CSV = "epochs.csv"
EVAL_JSON = "eval.json"
CONFUSION_CSV = "confusion.csv"
CONFUSION_PNG = "confusion.png"
RUN_JSON = "run.json"
PER_CLASS_CSV = "per_class.csv"
QUANTIZED_JSON = "quantized.json"
ENV_DEVICES = ("cpu", "cuda")  # env/<device>.json; a variant's stage depends on its device's


def env_json(folder: Path, device: str) -> Path:
    return folder / f"{device}.json"


def _in_folder(name: str) -> property:
    """A MetricsFiles path: `name` in its folder."""
    return property(lambda files: files.folder / name, doc=f"`{name}` in the folder")


@dataclass(frozen=True)
class MetricsFiles:
    """One variant's metrics folder (`metrics/<variant>/` in dvc.yaml) and its files."""

    folder: Path

    train_json = _in_folder(TRAIN_JSON)
    epochs_csv = _in_folder(EPOCHS_CSV)
    eval_json = _in_folder(EVAL_JSON)
    confusion_csv = _in_folder(CONFUSION_CSV)
    confusion_png = _in_folder(CONFUSION_PNG)
    run_json = _in_folder(RUN_JSON)
    per_class_csv = _in_folder(PER_CLASS_CSV)
    quantized_json = _in_folder(QUANTIZED_JSON)


STAGED_PREFIX = ".new."  # keeps the suffix: matplotlib and torch go by it


# --- What a stage may write (docs/reliability.md, "What accelbench writes") -----------------
#
# A stage writes only its own outputs, at the paths it is given. A path that exists is
# replaced only when it is recognisably what accelbench writes there (a marker it writes, or
# the expected structure); anything else is the user's, and the stage refuses to start.

_MAX_RECOGNISED_BYTES = 64 << 20  # a results file this large is someone else's


@dataclass(frozen=True)
class Kind:
    """What accelbench writes at an output path, and how to recognise it there."""

    description: str  # "a results file written by accelbench": the refusal names it
    recognise: Callable[[Path], bool]  # the existing file (links followed) is one of ours


def _head(path: Path, size: int = 4096) -> bytes:
    with path.open("rb") as handle:
        return handle.read(size)


def json_payload(path: Path) -> Any:
    """A file's JSON (None: not JSON, or too large to be a results file)."""
    if path.stat().st_size > _MAX_RECOGNISED_BYTES:
        return None
    try:
        return json.loads(path.read_bytes())
    except ValueError:
        return None


def json_kind(description: str, *keys: str) -> Kind:
    """A JSON object (with `keys`, where given)."""

    def recognise(path: Path) -> bool:
        payload = json_payload(path)
        return isinstance(payload, dict) and all(key in payload for key in keys)

    return Kind(description, recognise)


def text_kind(description: str, first_line: str) -> Kind:
    """A text file whose first line starts with `first_line` (a CSV's header, a title)."""
    prefix = first_line.encode()
    return Kind(description, lambda path: _head(path, len(prefix)) == prefix)


def _matplotlib_png(path: Path) -> bool:
    head = _head(path)  # matplotlib names itself in a tEXt chunk before the image data
    return head.startswith(b"\x89PNG\r\n\x1a\n") and b"Software\x00Matplotlib" in head


def _model_file(path: Path) -> bool:
    head = _head(path, 512)
    if head.startswith(b"{"):  # a skipped variant's, as JSON
        payload = json_payload(path)
        return isinstance(payload, dict) and {"variant", "status"} <= set(payload)
    # torch.save's zip: its first entry is `<archive>/data.pkl`
    return head.startswith(b"PK\x03\x04") and b"/data.pkl" in head[:128]


RESULTS_FILE = json_kind("a results file written by accelbench", "status")
FIGURE = Kind("a figure written by accelbench (a matplotlib PNG)", _matplotlib_png)
MODEL = Kind("a model file written by `accelbench train`", _model_file)
ENV_FACTS = {
    "cpu": json_kind("an env facts file written by `accelbench env`", "cpu_model"),
    "cuda": json_kind("an env facts file written by `accelbench env`", "cuda_available"),
}
_KINDS_BY_NAME = {
    TRAIN_JSON: RESULTS_FILE,
    EVAL_JSON: RESULTS_FILE,
    RUN_JSON: RESULTS_FILE,
    QUANTIZED_JSON: RESULTS_FILE,
    EPOCHS_CSV: text_kind("an epochs.csv written by `accelbench train`", "epoch"),
    PER_CLASS_CSV: text_kind("a per_class.csv written by accelbench", "digit,precision,recall,f1"),
    CONFUSION_CSV: text_kind("a confusion.csv written by accelbench", "actual,predicted"),
}
_KINDS_BY_SUFFIX = {".png": FIGURE, ".pt": MODEL}


def kind_of(path: Path) -> Kind:
    """The kind of a stage's output file, by its name (other outputs name their kind)."""
    kind = _KINDS_BY_NAME.get(path.name) or _KINDS_BY_SUFFIX.get(path.suffix)
    if kind is None:
        raise ValueError(f"{path.name}: no output kind registered for it; pass one")
    return kind


def refuse_foreign(path: Path, kind: Kind | None = None) -> None:
    """Raise an InputError (before anything is written) if `path` exists and is not what
    accelbench writes there: a user's file is never replaced. Absent (or a dangling link,
    which only the link would lose): fine."""
    kind = kind or kind_of(path)
    if not path.exists():
        return
    if path.is_dir():
        found = "a folder"
    elif not path.is_file():
        found = "a special file"  # a FIFO or a device: never opened
    else:
        try:
            if kind.recognise(path):
                return
        except OSError as exc:
            raise InputError(
                f"{path}: exists and cannot be read ({exc.strerror}); accelbench replaces "
                "only its own outputs: fix its permissions, move it away or pass another path"
            ) from None
        found = "a file"
    raise InputError(
        f"{path}: exists and is {found}, not {kind.description}; accelbench replaces only "
        "its own outputs: move it away or pass another path"
    )


def refuse_foreign_folder(folder: Path) -> None:
    """An output folder (`--metrics`, `--out`) that is a file or a symlink loop is refused,
    never replaced."""
    try:
        folder.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(
                f"{folder}: is a symbolic link loop, not a folder; accelbench writes its outputs "
                "into a folder: remove or fix the link, or pass another path"
            ) from None
    if folder.exists() and not folder.is_dir():
        raise InputError(
            f"{folder}: exists and is {_a_file(folder)}, not a folder; accelbench writes its "
            "outputs into a folder: move it away or pass another path"
        )


def _a_file(path: Path) -> str:
    """What is at an existing `path` that is no folder: a file, or a special one (a device,
    a FIFO, a socket)."""
    return "a file" if path.is_file() else "a special file"


def claim(*finals: Path) -> None:
    """At a stage's start: every output path is absent or one of ours (by its name's kind)."""
    for final in finals:
        refuse_foreign_folder(final.parent)
        refuse_foreign(final)


class StagedOutputs:
    """Where a stage writes its outputs before they are renamed into place (`staged`)."""

    def __init__(self) -> None:
        self.pending: list[tuple[Path, Path]] = []
        self.removals: list[Path] = []

    def __call__(self, final: Path, kind: Kind | None = None) -> Path:
        """The temporary to write `final` to (beside it: the rename stays on one disk);
        refused if `final` is not one of ours (`kind`: by default, by its name)."""
        refuse_foreign_folder(final.parent)
        refuse_foreign(final, kind)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.with_name(STAGED_PREFIX + final.name)
        temporary.unlink(missing_ok=True)  # a leftover (or a link): never written through
        self.pending.append((temporary, final))
        return temporary

    def remove(self, final: Path, kind: Kind | None = None) -> None:
        """Remove `final` (one of ours, no longer produced) when the outputs are renamed."""
        refuse_foreign(final, kind)
        self.removals.append(final)


@contextmanager
def staged() -> Iterator[StagedOutputs]:
    """A stage's outputs, all new or all old: each is written to a temporary, and they are
    renamed into place only once every one of them was written (a full disk or a folder
    that is not writable leaves the old outputs, all of them, and no temporaries). A rename
    replaces a link at the final path, never its target, and gives the file a new inode: a
    hard link into DVC's cache keeps the old content."""
    outputs = StagedOutputs()
    try:
        yield outputs
        for temporary, final in outputs.pending:
            os.replace(temporary, final)
        for final in outputs.removals:
            final.unlink(missing_ok=True)
    finally:
        for temporary, _ in outputs.pending:
            temporary.unlink(missing_ok=True)


def remove_leftovers(*finals: Path) -> None:
    """The temporaries of `finals` that a killed earlier run left behind."""
    for final in finals:
        for name in (
            STAGED_PREFIX + final.name,
            f".{final.name}.tmp",
            f".{STAGED_PREFIX}{final.name}.tmp",
        ):
            (final.parent / name).unlink(missing_ok=True)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary beside `path` to write; renamed onto `path` if the block succeeds, removed
    if it fails (a full disk leaves the old file and no temporary). Never writes through a
    link at `path` or at the temporary's name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, payload: Any) -> None:
    """Write JSON atomically: a crash never leaves a half-written metrics file."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write text (UTF-8) atomically, as write_json."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@functools.cache
def _scalar_types(cls: type) -> dict[str, tuple[type, ...]]:
    """The fields of `cls` whose values are plain scalars, and the types each takes (None
    included where optional); lists, mappings and nested records are checked by their own."""
    scalars = (bool, int, float, str, type(None))
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if all(kind in scalars for kind in kinds):
            out[name] = kinds
    return out


def _misfit(value: Any, kinds: tuple[type, ...]) -> bool:
    """`value` is not one of `kinds` (an int is a float, a bool is neither)."""
    if isinstance(value, bool):
        return bool not in kinds
    if isinstance(value, int) and float in kinds:
        return False
    return not isinstance(value, kinds)


def _strict(cls: type, payload: Mapping[str, Any], source: str, typed: bool = True) -> Any:
    """`cls(**payload)`, with a message naming the file and the keys that do not fit: unknown
    or missing, and where the values are `typed` (JSON's, not a CSV's text) a value of the
    wrong type (a number as text) or an accuracy outside 0..1."""
    required = {
        f.name for f in fields(cls) if MISSING is f.default and MISSING is f.default_factory
    }
    unknown = set(payload) - {f.name for f in fields(cls)}
    missing = required - set(payload)
    redo = "re-run the stage that writes it"
    if unknown or missing:
        raise InputError(
            f"{source}: not a {cls.__name__} (unknown keys: {sorted(unknown) or 'none'}, "
            f"missing keys: {sorted(missing) or 'none'}); {redo}"
        )
    for name, kinds in _scalar_types(cls).items() if typed else ():
        value = payload.get(name)
        if name in payload and _misfit(value, kinds):
            allowed = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise InputError(f"{source}: {name} = {echo(value)}, not {allowed}; {redo}")
        if name.endswith("accuracy") and isinstance(value, float | int) and not 0 <= value <= 1:
            raise InputError(f"{source}: {name} = {value!r}, not a fraction in 0..1; {redo}")
    return cls(**payload)


@dataclass(frozen=True)
class Skipped:
    """A variant this machine could not run (train.require_gpu false): recorded, not trained."""

    reason: str
    device: str | None = None
    status: str = "skipped"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrainSummary:
    """`train.json` of a trained variant: run-level figures, their units in their names."""

    epochs: int
    first_epoch_s: float
    steady_epoch_s: float | None  # median of steady_epochs_s; None after one epoch
    total_train_s: float
    steady_samples_per_s: float | None
    data_wait_fraction: float
    final_train_loss: float
    final_test_accuracy: float
    best_test_accuracy: float
    nonfinite_steps: int
    scaler_skipped_steps: int | None  # fp16 + GradScaler only
    peak_gpu_mem_mib: float | None
    steady_gpu_energy_j_per_epoch: float | None
    accumulation_steps: int  # as trained: an OOM retry may have raised it
    device: str
    device_name: str
    precision: str
    batches: str
    world_size: int
    train_samples: int
    flops_per_sample: int
    steady_tflops: float
    peak_tflops: float | None  # the datasheet's, where the device is known
    peak_share: float | None
    peak_host_rss_mib: float
    steady_samples_per_s_per_process: float | None
    compile_cache: str | None = None  # the first epoch's: cold | warm | portable | partial
    steady_cpu_energy_j_per_epoch: float | None = None  # RAPL, where readable
    # every steady epoch's seconds: the run's `steady_epochs`, then each timing repeat's
    # (`train.repeats`); the report's intervals are drawn from them. None: an older file
    steady_epochs_s: list[float] | None = None
    repeats: int = 1  # trainings: the run itself, and repeats - 1 more from scratch
    # each repeat's epochs as [seconds, test accuracy], repeat k at the run's seed + k
    repeat_epochs: list[list[list[float]]] = field(default_factory=list)
    # what else ran on this host while it trained (other stages holding GPU or CPU locks,
    # other processes' CPU use), in a line (`system/slots.py`); None: nothing, or an older file
    shared_machine: str | None = None
    status: str = "trained"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float | int | None]:
        """The numeric figures, for a tracker (`epochs` is a count, not a figure)."""
        return {
            k: v
            for k, v in asdict(self).items()
            if k != "epochs" and (v is None or isinstance(v, int | float))
        }


TrainResult = TrainSummary | Skipped


def train_from_json(payload: Mapping[str, Any], source: str = TRAIN_JSON) -> TrainResult:
    if payload.get("status") == "skipped":
        return _strict(Skipped, payload, source)
    return _strict(TrainSummary, payload, source)


def _read_json(path: Path) -> Mapping[str, Any]:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{path}: not readable JSON ({exc}); re-run the stage that writes it"
        ) from None
    if not isinstance(payload, dict):
        raise InputError(f"{path}: not a results file; re-run the stage that writes it")
    return payload


def read_train(path: Path) -> TrainResult:
    return train_from_json(_read_json(path), str(path))


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


@dataclass(frozen=True)
class ClassScores:
    precision: float
    recall: float
    f1_score: float

    def to_json(self) -> dict[str, float]:
        return {"precision": self.precision, "recall": self.recall, "f1-score": self.f1_score}


@dataclass(frozen=True)
class EvalSummary:
    """`eval.json` of a trained variant: the test set through the trained model, untimed
    training excluded; per-class scores keyed by the digit."""

    test_accuracy: float
    test_loss: float
    macro_f1: float
    inference_samples_per_s: float
    per_class: dict[str, ClassScores]
    # what else held GPU or CPU slots on this host while it measured (`system/slots.py`);
    # None: nothing, or an older file
    shared_machine: str | None = None
    status: str = "trained"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_class": {k: v.to_json() for k, v in self.per_class.items()}}


EvalResult = EvalSummary | Skipped


@dataclass(frozen=True)
class RunRecord:
    """`run.json`, written by evaluate for compare: which MLflow run the variant's results
    belong to (compare logs the evaluation there, once, for every variant), or why there is
    none (a skipped variant: compare records it as a run that says why)."""

    variant: str
    status: str  # trained | skipped
    mlflow_run_id: str | None
    params: dict[str, Any] | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_run_record(path: Path) -> RunRecord:
    return _strict(RunRecord, _read_json(path), str(path))


def write_per_class_csv(path: Path, result: EvalResult) -> None:
    """Precision, recall and F1 of each digit (DVC plots it; a skipped variant: the header)."""
    per_class = result.per_class if isinstance(result, EvalSummary) else {}
    with atomic_path(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["digit", "precision", "recall", "f1"])
        for digit, scores in sorted(per_class.items(), key=lambda item: int(item[0])):
            writer.writerow([digit, scores.precision, scores.recall, scores.f1_score])


def eval_from_json(payload: Mapping[str, Any], source: str = EVAL_JSON) -> EvalResult:
    if payload.get("status") != "trained":
        return _strict(Skipped, payload, source)
    per_class = {
        digit: ClassScores(s["precision"], s["recall"], s["f1-score"])
        for digit, s in payload["per_class"].items()
    }
    return _strict(EvalSummary, {**payload, "per_class": per_class}, source)


def read_eval(path: Path) -> EvalResult:
    return eval_from_json(_read_json(path), str(path))


QUANT_METHODS = ("fp32", "dynamic_int8", "static_int8")  # the quantize stage's, in order


@dataclass(frozen=True)
class InferenceFigures:
    """One model (fp32 or quantized) on the CPU: accuracy, speed and size."""

    method: str  # one of QUANT_METHODS
    test_accuracy: float
    latency_ms: float  # batch 1: median over the repetitions
    samples_per_s: float  # over the test set at the eval batch size
    size_bytes: int


@dataclass(frozen=True)
class QuantizedSummary:
    """`quantized.json`: the trained model on the CPU in fp32 and quantized to int8, each
    method's figures keyed by its name (QUANT_METHODS); a method this torch build cannot run
    is in `unsupported` with the reason."""

    threads: int  # CPU threads the figures were measured with
    batch_size: int  # throughput's batch; latency is at batch 1
    latency_repeats: int
    methods: dict[str, InferenceFigures]
    unsupported: dict[str, str]  # method -> why not
    status: str = "trained"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """Flat figures for a tracker: `quant_<method>_<figure>`."""
        return {
            f"quant_{method}_{key}": value
            for method, figures in self.methods.items()
            for key, value in asdict(figures).items()
            if isinstance(value, int | float)
        }


QuantizedResult = QuantizedSummary | Skipped


def read_quantized(path: Path) -> QuantizedResult:
    payload, source = _read_json(path), str(path)
    if payload.get("status") != "trained":
        return _strict(Skipped, payload, source)
    summary = _strict(QuantizedSummary, payload, source)
    named = [*summary.methods, *summary.unsupported] if isinstance(summary.methods, dict) else []
    if not named or not set(named) <= set(QUANT_METHODS):
        raise InputError(
            f"{source}: not a QuantizedSummary (methods: {named}, expected some of "
            f"{list(QUANT_METHODS)}); re-run the stage that writes it"
        )
    methods = {
        method: _strict(InferenceFigures, figures, f"{source} ({method})")
        for method, figures in summary.methods.items()
    }
    return replace(summary, methods=methods)


# --- env/<device>.json: the machine's stable facts (the env stage writes, compare reads) ---


@dataclass(frozen=True)
class SoftwareFacts:
    """The software stack, in both env files."""

    python: str
    torch: str
    torchvision: str | None  # None: not installed


def _split(cls: type, payload: Mapping[str, Any], source: str) -> tuple[Any, dict[str, Any]]:
    """The keys of `cls` in a flat payload as a `cls` (strictly), and the other keys."""
    names = {f.name for f in fields(cls)}
    part = _strict(cls, {k: v for k, v in payload.items() if k in names}, source)
    return part, {k: v for k, v in payload.items() if k not in names}


@dataclass(frozen=True)
class CpuFacts:
    """`env/cpu.json`: the CPU and the software stack (flat in the file)."""

    cpu_model: str
    logical_cpus: int | None  # os.cpu_count(); None where it cannot tell
    torch_default_threads: int
    machine: str  # platform.machine(): x86_64, aarch64
    software: SoftwareFacts

    def to_json(self) -> dict[str, Any]:
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "software"}
        return own | asdict(self.software)

    @classmethod
    def from_json(cls, payload: Mapping[str, Any], source: str) -> CpuFacts:
        software, own = _split(SoftwareFacts, payload, source)
        return _strict(cls, own | {"software": software}, source)


@dataclass(frozen=True)
class GpuFacts:
    """The GPUs torch can use, as `env/cuda.json` records them (capability, memory: GPU 0's)."""

    gpu_count: int
    gpu_names: list[str]
    compute_capability: str  # "9.0"
    gpu_memory_gib: float
    cudnn: int | None
    bf16_supported: bool


@dataclass(frozen=True)
class CudaFacts:
    """`env/cuda.json`: torch's CUDA build, the driver and the software stack, then either the
    GPUs torch can use (`gpu`) or why it can use none (`reason`); flat in the file, with
    `cuda_available` saying which."""

    torch_cuda_runtime: str | None  # None: a CPU-only torch build
    nvidia_driver: str | None  # None: no driver found
    software: SoftwareFacts
    gpu: GpuFacts | None = None
    reason: str | None = None  # where `gpu` is None

    def __post_init__(self) -> None:
        if (self.gpu is None) == (self.reason is None):
            raise ValueError("CudaFacts: exactly one of the GPUs (gpu) and why none (reason)")

    @property
    def cuda_available(self) -> bool:
        return self.gpu is not None

    def to_json(self) -> dict[str, Any]:
        facts = {
            "torch_cuda_runtime": self.torch_cuda_runtime,
            "nvidia_driver": self.nvidia_driver,
            **asdict(self.software),
            "cuda_available": self.cuda_available,
        }
        return facts | (asdict(self.gpu) if self.gpu else {"reason": self.reason})

    @classmethod
    def from_json(cls, payload: Mapping[str, Any], source: str) -> CudaFacts:
        available = payload.get("cuda_available")
        if not isinstance(available, bool):
            raise InputError(
                f"{source}: not a CudaFacts (cuda_available = {available!r}, expected true or "
                "false); re-run the stage that writes it"
            )
        rest = {k: v for k, v in payload.items() if k != "cuda_available"}
        software, rest = _split(SoftwareFacts, rest, source)
        gpu = None
        if available:
            gpu, rest = _split(GpuFacts, rest, source)
        if (rest.get("reason") is not None) == available:
            raise InputError(
                f"{source}: not a CudaFacts (cuda_available is {str(available).lower()}: "
                f"expected {'no reason' if available else 'the reason'}); re-run the stage "
                "that writes it"
            )
        return _strict(cls, rest | {"software": software, "gpu": gpu}, source)


@dataclass(frozen=True)
class EnvFacts:
    """The machine the variants ran on: `env/<device>.json` for each of ENV_DEVICES."""

    cpu: CpuFacts
    cuda: CudaFacts

    def files(self) -> dict[str, dict[str, Any]]:
        """Each file's JSON, by its device."""
        return {"cpu": self.cpu.to_json(), "cuda": self.cuda.to_json()}


def read_env(folder: Path) -> EnvFacts:
    """`env/`'s files, as the env stage wrote them."""
    cpu, cuda = env_json(folder, "cpu"), env_json(folder, "cuda")
    return EnvFacts(
        CpuFacts.from_json(_read_json(cpu), str(cpu)),
        CudaFacts.from_json(_read_json(cuda), str(cuda)),
    )


@dataclass(frozen=True)
class ModelFile:
    """`models/<variant>.pt`: the trained weights (CPU tensors) and what produced them.

    `params` is the run's params (`{"variant": {...}, "train": {...}}`), so the file says how
    its weights were trained. A skipped variant's file carries the reason instead of weights,
    as JSON: it has no tensors, and writing and reading it needs no torch import, so the
    stages of a variant this machine cannot run return at once.
    """

    variant: str
    status: str
    mlflow_run_id: str | None
    params: dict[str, Any] | None = None
    state_dict: dict[str, Any] | None = None
    reason: str | None = None

    @property
    def trained(self) -> bool:
        return self.status == "trained"

    def save(self, path: Path) -> None:
        """torch.save (JSON without weights) to a temporary file, then rename: a kill mid-save
        keeps the old file."""
        if self.state_dict is None and not self.trained:
            write_json(path, asdict(self))
        else:
            atomic_torch_save(asdict(self), path)

    @classmethod
    def load(cls, path: Path) -> ModelFile:
        """Read a model file (tensors and plain types only: `weights_only`, never code);
        anything that is not one of ours is an InputError naming the file."""
        if not path.is_file():
            what = (
                "is a folder"
                if path.is_dir()
                else f"is {_a_file(path)}"
                if path.exists()
                else "does not exist"
            )
            raise InputError(f"{path}: {what}; expected a model file written by `accelbench train`")
        not_ours = f"{path}: not a model file written by `accelbench train`"
        with path.open("rb") as handle:
            is_json = handle.read(1) == b"{"  # a skipped variant's (torch.save writes a zip)
        payload = _read_json(path) if is_json else _torch_payload(path, not_ours)
        try:
            model_file = _strict(cls, payload, str(path)) if isinstance(payload, dict) else None
        except (ValueError, TypeError):
            model_file = None
        if model_file is None or not isinstance(model_file.variant, str):
            raise InputError(f"{not_ours} (another structure); re-run train for it")
        if model_file.trained and not (
            isinstance(model_file.state_dict, dict) and isinstance(model_file.params, dict)
        ):
            raise InputError(f"{not_ours} (no weights or params); re-run train for it")
        return model_file


def _torch_payload(path: Path, not_ours: str) -> Any:
    """What torch.save wrote to `path` (tensors and plain types only, never code)."""
    with phases.phase("imports"):
        import torch

    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning: not news
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # garbage, empty, truncated, pickled code: many types
        reason = first_sentence(exc, 100)
        raise InputError(f"{not_ours} ({reason}); re-run train for it") from None


def atomic_torch_save(payload: Any, path: Path) -> None:
    """torch.save to a temporary, then rename; a failed save (a full disk) leaves the old
    file and no temporary. torch's zip writer reports a write that failed for want of space
    (a full disk, a quota, `ulimit -f`) as a RuntimeError ("unexpected pos 79488 vs 79440"),
    with the OSError behind it: that is raised as what it is, naming the file."""
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


@dataclass(frozen=True)
class EpochRecord:
    """One trained epoch: a row of `epochs.csv` (its columns, in this order), a step of the
    variant's MLflow metrics, and part of the checkpointed training state."""

    epoch: int  # 1-based
    train_loss: float
    train_time_s: float
    data_wait_s: float
    samples: int
    samples_per_s: float
    test_loss: float
    test_accuracy: float
    nonfinite_steps: int
    lr: float
    peak_gpu_mem_mib: float | None
    gpu_energy_j: float | None = None  # board energy during the timed training, from NVML
    cpu_energy_j: float | None = None  # CPU packages' energy in the same window, from RAPL
    scaler_skipped_steps: int | None = None  # fp16: steps GradScaler skipped (inf/NaN grads)
    # seconds the process did not run in the timed epoch (SIGSTOP, a suspend, no CPU), from a
    # heartbeat (`timing.Heartbeat`); over STOPPED_LIMIT_S or STOPPED_SHARE: no steady epoch
    stopped_s: float = 0.0
    # Its process's first epoch, which paid for compilation, autotuning and graph capture:
    # epoch 1, and the first after a resume. Never a steady epoch (`steady_epochs`).
    warm_up: bool = False

    @property
    def stopped(self) -> bool:
        """Stopped for a substantial part of it: what it measured is not the training."""
        return self.stopped_s > min(STOPPED_LIMIT_S, STOPPED_SHARE * self.train_time_s)

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)

    def metrics(self) -> dict[str, float | int | None]:
        """The epoch's figures as MLflow metrics (the warm-up mark is no figure)."""
        return {k: v for k, v in asdict(self).items() if k != "warm_up"}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = EPOCHS_CSV) -> EpochRecord:
        """From `as_dict`'s output (a checkpoint's) or an epochs.csv row (text, empty for
        None); an InputError names `source` and what does not fit."""
        record = _strict(cls, values, source, typed=False)  # converted below
        converted = {}
        for f in fields(cls):
            value = getattr(record, f.name)
            optional = "None" in f.type
            if optional and value in (None, "", "None"):
                converted[f.name] = None
                continue
            if f.type == "bool":  # True/False, as csv writes them, or a checkpoint's bool
                if value not in (True, False, "True", "False"):
                    raise InputError(
                        f"{source}: epoch field {f.name} = {value!r} is not True or False; "
                        "re-run train"
                    )
                converted[f.name] = value in (True, "True")
                continue
            number = int if f.type.startswith("int") else float
            try:
                if isinstance(value, bool) or not isinstance(value, int | float | str):
                    raise TypeError
                converted[f.name] = number(value)
            except (TypeError, ValueError):
                what = "an integer" if number is int else "a number"
                raise InputError(
                    f"{source}: epoch field {f.name} = {value!r} is not {what}; re-run train"
                ) from None
        return cls(**converted)


def steady_epochs(records: Sequence[EpochRecord]) -> list[EpochRecord]:
    """The steady epochs of one training: every epoch but its processes' first (epoch 1, and
    a resumed training's first), which compiled, autotuned and captured graphs, and but
    those the process was `stopped` in."""
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
    """One row per epoch (DVC plots it: x epoch, y test_accuracy); a skipped variant's file
    has the header `epoch` alone."""
    columns = [f.name for f in fields(EpochRecord)] if records else ["epoch"]
    with atomic_path(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(record.as_dict() for record in records)


def read_epoch_records(path: Path) -> list[EpochRecord]:
    """`write_epochs_csv`'s records back."""
    with path.open() as handle:
        return [EpochRecord.from_dict(row, str(path)) for row in csv.DictReader(handle)]
