"""Typed, validated params.yaml: loaded once at the edge, passed down as small pieces.

Every stage validates the whole file first: an error names the key, the value (at most
`console.ECHO_CHARS` characters) and what is allowed. The file is read as DVC reads it (YAML
1.2, ruamel.yaml): `0512` is 512, `yes` a string. Values are strict (a number, a boolean and a
string never turn into each other: the run trains with what DVC records) and bounded where one
could hurt: floats finite, seeds what numpy and torch accept, threads and processes at most
`PER_CPU` per logical CPU, the file capped in size and in values after alias expansion.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from accelbench.core.console import InputError, clip, echo
from accelbench.core.problems import problems

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]

Device = Literal["cpu", "cuda"]
Precision = Literal["fp32", "fp16", "bf16"]
BatchSource = Literal["resident", "dataloader"]
CompileMode = Literal[
    "none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
]
Schedule = Literal["constant", "onecycle"]
Dataset = Literal["mnist", "cifar10"]
# Each dataset's training and test images: the most a batch can hold.
SPLIT_SIZES = {"mnist": (60_000, 10_000), "cifar10": (50_000, 10_000)}


class ParamsError(InputError):
    """params.yaml is missing, unreadable or invalid; the message lists every problem."""


class _Strict(BaseModel):
    # allow_inf_nan=False: every float is finite (.inf, .nan are refused, naming the key).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# Threads or processes a variant may start per logical CPU of the machine that validates the
# file: more only oversubscribes the CPUs (or exhausts the process table).
PER_CPU = 4


def cpu_limit() -> int:
    """The most threads (or processes) one setting may start here: PER_CPU per logical CPU."""
    return PER_CPU * (os.cpu_count() or 1)


def _check_per_cpu(value: int | None, unit: str) -> int | None:
    if value is not None and value > cpu_limit():
        raise ValueError(
            f"more {unit} than {PER_CPU} per logical CPU of this machine "
            f"({os.cpu_count() or 1} CPUs): use at most {cpu_limit()}"
        )
    return value


# The mirror forms data.py can fetch from: http(s) and file URLs, or a local folder.
MIRROR_SCHEMES = ("http", "https", "file")
# A variant name becomes a DVC stage key (`train@<name>`), a command-line argument and file
# names (models/<name>.pt, metrics/<name>/): letters, digits, '_' and '-', not first.
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class DataParams(_Strict):
    # mnist: the seed CNN on MNIST; cifar10: the DDP/AMP tutorial's LeNet on CIFAR-10
    dataset: Dataset = "mnist"
    mirrors: list[str] = Field(min_length=1)  # MNIST's
    cifar10_mirrors: list[str] = Field(default=["https://www.cs.toronto.edu/~kriz/"], min_length=1)
    # The official archive's MD5 (torchvision's too); change it only for a copy you verified.
    cifar10_md5: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] = (
        "c58f30108f718f92721af3b95e74349a"
    )
    timeout_s: PositiveFloat = 30.0
    retries: NonNegativeInt = 2
    deadline_s: PositiveFloat = 600.0  # one file from one mirror, every read and retry included

    @field_validator("mirrors", "cifar10_mirrors")
    @classmethod
    def _check_mirrors(cls, mirrors: list[str]) -> list[str]:
        for mirror in mirrors:
            if problem := mirror_problem(mirror):
                raise ValueError(f"mirror {echo(mirror)}: {problem}")
        return mirrors


def mirror_problem(mirror: str) -> str | None:
    """Why data.py could not fetch from `mirror` (None: it can)."""
    if not mirror.strip():
        return "empty (use an http(s):// or file:// URL, or a folder)"
    parsed = urlparse(mirror)
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # a path (or a Windows drive)
        return None
    if parsed.scheme not in MIRROR_SCHEMES:
        return f"unsupported scheme {parsed.scheme!r} (use http(s)://, file:// or a folder)"
    if parsed.scheme != "file" and not parsed.netloc:
        return "no host (write it as https://host/path/)"
    return None


class LoaderParams(_Strict):
    """The tutorials' DataLoader knobs; used only by `batches: dataloader`."""

    num_workers: NonNegativeInt = 4
    pin_memory: bool = True
    persistent_workers: bool = True
    prefetch_factor: PositiveInt = 2

    @field_validator("num_workers")
    @classmethod
    def _bounded_workers(cls, value: int) -> int:
        return _check_per_cpu(value, "worker processes")


class TrainRecipe(_Strict):
    """How every variant trains: the `train:` keys a training stage reads (and dvc.yaml lists)."""

    seed: Seed = 0  # 0..4294967295 (2**32 - 1), what numpy and torch accept
    epochs: PositiveInt = 10
    batch_size: PositiveInt = 512
    eval_batch_size: PositiveInt = 2048
    lr: PositiveFloat = 1e-3
    schedule: Schedule = "constant"
    onecycle_max_lr_factor: PositiveFloat = 10.0
    onecycle_pct_start: Annotated[float, Field(gt=0, lt=1)] = 0.25
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.25  # the seed CNN's Dropout2d rate
    shift_px: Annotated[int, Field(ge=0, le=8)] = 0  # random translation augmentation; 0 = off
    accumulation_steps: PositiveInt = 1  # forward/backward passes per optimizer step
    oom_retries: NonNegativeInt = 0  # on CUDA OOM: halve the per-pass batch, double accumulation
    max_nonfinite_steps: PositiveInt = 20  # consecutive NaN/inf losses before the stage fails
    train_subset: NonNegativeInt = 0  # 0 = the whole training set
    test_subset: NonNegativeInt = 0  # 0 = the whole test set
    deterministic: bool = False  # deterministic algorithms (slower); for bitwise-repeatable runs
    # trainings per variant: the run at `seed`, then repeats - 1 more from scratch at seed + 1,
    # ...: their steady epochs join the spread; their epochs give time to target over seeds
    repeats: Annotated[int, Field(ge=1, le=20)] = 1


class TrainParams(TrainRecipe):
    """The `train:` section: the recipe, plus two keys no training output depends on."""

    target_accuracy: Annotated[float, Field(gt=0, le=1)] = 0.99  # the report's "time to reach"
    require_gpu: bool = False  # refuse, rather than skip, a variant this machine cannot run


class DistributedParams(_Strict):
    """A DistributedDataParallel variant, launched by torchrun (its options, same names)."""

    nproc_per_node: PositiveInt = 2  # processes (GPUs) per machine
    nnodes: PositiveInt = 1
    node_rank: NonNegativeInt = 0  # this machine's index, 0..nnodes-1
    # host:port of node 0, reachable from every node. Static rendezvous: node_rank 0 holds
    # global rank 0, the process that writes the outputs.
    rdzv_endpoint: str = "127.0.0.1:29500"
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # auto: nccl on cuda, gloo on cpu
    # How long a rank waits in a collective (or for the others at the end) before its stage
    # fails naming the rank and the operation: a stuck rank never hangs the pipeline.
    timeout_s: Annotated[int, Field(ge=10, le=3600)] = 300

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


class VariantParams(_Strict):
    device: Device
    precision: Precision = "fp32"
    batches: BatchSource = "resident"
    threads: PositiveInt | None = None  # CPU intra-op threads; None = torch's default
    channels_last: bool = False
    cudnn_benchmark: bool = False
    tf32: bool = False
    compile: CompileMode = "none"
    # compile 'default' only. true: Inductor times several launch configs of each kernel at the
    # first call (torch's default); false: one each (an H200's cold first epoch: 4 s less)
    kernel_autotune: bool = True
    fused_optimizer: bool = False
    cuda_graph: bool = False  # capture the whole training step in one CUDA graph
    # this variant's own epochs (None: train.epochs): a slow baseline times fewer; its time
    # to target then comes from its own epochs, or reads "not reached"
    epochs: PositiveInt | None = None
    repeats: Annotated[int, Field(ge=1, le=20)] | None = None  # its own train.repeats
    distributed: DistributedParams | None = None  # set: a DDP variant launched by torchrun
    loader: LoaderParams | None = None  # batches: dataloader only; unset = LoaderParams()

    @field_validator("threads")
    @classmethod
    def _bounded_threads(cls, value: int | None) -> int | None:
        return _check_per_cpu(value, "threads")

    @model_validator(mode="after")
    def _check_combinations(self) -> VariantParams:
        if self.device == "cpu" and self.precision == "fp16":
            raise ValueError(
                "precision 'fp16' needs device 'cuda' (GradScaler fp16 autocast is a GPU "
                "recipe); on the CPU use 'fp32' or 'bf16'"
            )
        if self.device == "cpu" and self.fused_optimizer:
            raise ValueError("fused_optimizer: true needs device 'cuda'")
        if self.cuda_graph and self.device != "cuda":
            raise ValueError("cuda_graph: true needs device 'cuda'")
        if self.cuda_graph and self.precision == "fp16":
            raise ValueError(
                "cuda_graph: true cannot capture GradScaler's fp16 steps; use precision 'bf16' "
                "(no scaler needed) or cuda_graph: false"
            )
        if self.cuda_graph and self.compile in ("reduce-overhead", "max-autotune"):
            raise ValueError(  # both modes capture CUDA graphs of their own (cudagraph trees)
                "cuda_graph: true already captures the step; use compile 'default' or "
                f"'max-autotune-no-cudagraphs' with it, not {self.compile!r}"
            )
        if not self.kernel_autotune and self.compile != "default":
            raise ValueError(
                "kernel_autotune: false is an option of compile 'default' (the max-autotune "
                f"modes tune by design, 'none' generates no kernels), not {self.compile!r}"
            )
        if self.loader is not None and self.batches != "dataloader":
            raise ValueError("loader: is read only by variants with batches 'dataloader'")
        if self.distributed is not None:
            if self.device == "cpu":  # one process per CPU "device" (a GPU variant needs GPUs)
                _check_per_cpu(self.distributed.nproc_per_node, "distributed.nproc_per_node")
            if self.distributed.backend == "nccl" and self.device != "cuda":
                raise ValueError("distributed.backend 'nccl' needs device 'cuda'; use 'gloo'")
            if self.distributed.backend == "gloo" and self.cuda_graph:
                raise ValueError(
                    "cuda_graph: true captures the gradient all-reduce in the graph, which "
                    "needs distributed.backend 'nccl' (or 'auto'), not 'gloo'"
                )
        return self

    @property
    def uses_cuda(self) -> bool:
        return self.device == "cuda"


class ReportParams(_Strict):
    """Read by the compare stage only: changing them redraws the report, retrains nothing."""

    speedup_baseline: str | None = None  # every "speedup vs" is over this variant's steady epoch
    # DDP variant -> the single-process variant with its settings: the scaling table's base
    scaling_baselines: dict[str, str] = Field(default_factory=dict)


class CostParams(_Strict):
    """Prices for the report's cost table (compare stage only): tutorial B's energy figures;
    the hourly prices are the machine's price spread over its life (or a cloud rate)."""

    kwh_usd: NonNegativeFloat = 0.15  # electricity, per kWh
    cpu_system_w: PositiveFloat = 150.0  # a CPU-only system under load, where RAPL is not read
    gpu_system_w: PositiveFloat = 450.0  # a system per GPU under load, where NVML is not read
    cpu_hour_usd: NonNegativeFloat = 0.06  # a CPU system's hour
    gpu_hour_usd: NonNegativeFloat = 0.13  # one GPU's system hour (a DDP run pays per GPU)


class QuantizeParams(_Strict):
    """Read by the quantize stage: int8 inference on the CPU next to fp32."""

    # The variants whose models are quantized, a quantize@V stage each (dvc.yaml's foreach);
    # a params file without the key (a benchmark's candidates) quantizes none.
    variants: list[str] = []
    latency_repeats: Annotated[int, Field(ge=1, le=10_000)] = 100  # batch-1 forward passes
    calibration_samples: Annotated[int, Field(ge=1, le=60_000)] = 1024  # static int8 ranges


class Params(_Strict):
    data: DataParams
    train: TrainParams
    variants: dict[str, VariantParams] = Field(min_length=1)
    report: ReportParams = ReportParams()
    quantize: QuantizeParams = QuantizeParams()
    cost: CostParams = CostParams()

    @model_validator(mode="after")
    def _check_names(self) -> Params:
        folded: dict[str, str] = {}
        for name in self.variants:
            if not VARIANT_NAME.fullmatch(name):
                raise ValueError(
                    f"variant name {echo(name)} must be 1 to 64 ASCII letters, digits, '_' and '-', "
                    "starting with a letter or digit (it becomes a DVC stage name, a "
                    "command-line argument and a file name)"
                )
            if name.lower() in folded:
                raise ValueError(
                    f"variant names {echo(folded[name.lower()])} and {echo(name)} differ only in case "
                    "(their files would collide on a case-insensitive file system)"
                )
            folded[name.lower()] = name
        for name, variant in self.variants.items():
            if variant.distributed and self.train.batch_size % variant.distributed.world_size:
                raise ValueError(
                    f"variant {name!r}: train.batch_size {self.train.batch_size} must be divisible "
                    f"by the world size {variant.distributed.world_size} (each process takes an "
                    "equal share of every global batch)"
                )
        self._check_baselines()
        self._check_quantized()
        self._check_batches()
        return self

    def _check_batches(self) -> None:
        """A batch larger than its set would silently be the whole set. An evaluation batch
        shapes no result, so a test_subset below it is fine."""
        dataset, recipe = self.data.dataset, self.train
        train, test = SPLIT_SIZES[dataset]
        images = min(recipe.train_subset or train, train)
        problems = []
        if recipe.batch_size > images:
            left = "train.train_subset leaves" if images < train else f"{dataset} has"
            problems.append(
                f"train.batch_size = {recipe.batch_size}: at most the {images} training images "
                f"{left}"
            )
        if recipe.eval_batch_size > test:
            problems.append(
                f"train.eval_batch_size = {recipe.eval_batch_size}: at most the {test} test "
                f"images {dataset} has"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def _check_quantized(self) -> None:
        names = self.quantize.variants
        for name in names:
            if name not in self.variants:
                raise ValueError(
                    f"quantize.variants: {echo(name)} is not a variant "
                    f"(params.yaml defines: {', '.join(self.variants)})"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"quantize.variants {echo(names)}: a variant is named twice")

    def _check_baselines(self) -> None:
        defined = f"params.yaml defines: {', '.join(self.variants)}"
        base = self.report.speedup_baseline
        if base is not None and base not in self.variants:
            raise ValueError(f"report.speedup_baseline = {echo(base)}: not a variant ({defined})")
        for ddp, base in self.report.scaling_baselines.items():
            key = f"report.scaling_baselines.{clip(ddp)}"
            if ddp not in self.variants:
                raise ValueError(
                    f"{key}: {echo(ddp)} is not a variant ({defined}); remove the key, or "
                    "define the variant"
                )
            if self.variants[ddp].distributed is None:
                raise ValueError(f"{key}: {echo(ddp)} is not a variant with a distributed: section")
            if base not in self.variants or self.variants[base].distributed is not None:
                raise ValueError(
                    f"{key} = {echo(base)}: the baseline must be a single-process variant "
                    f"(no distributed: section; {defined})"
                )

    def variant(self, name: str) -> VariantParams:
        if name not in self.variants:
            raise ParamsError(
                f"unknown variant {echo(name)}; params.yaml defines: {', '.join(self.variants)}"
            )
        return self.variants[name]


def parse_params(raw: Any, source: str = "params.yaml") -> Params:
    """Validate a params mapping; raise ParamsError listing every problem found."""
    if raw is None:
        raise ParamsError(
            f"{source}: holds no params (empty, or comments only); it needs the sections "
            "data, train and variants, as the repository's params.yaml has them"
        )
    if not isinstance(raw, dict):
        raise ParamsError(
            f"{source}: expected a mapping at the top level, got {type(raw).__name__}"
        )
    for section, keys in raw.items():  # YAML reads `true:`, `1:`, `null:` as no string
        if isinstance(keys, dict) and (odd := [k for k in keys if not isinstance(k, str)]):
            key = odd[0]
            text = "null" if key is None else str(key).lower() if isinstance(key, bool) else key
            kind = "null" if key is None else "boolean" if isinstance(key, bool) else "number"
            raise ParamsError(
                f"{source}: {section}: the key {text} is read by YAML as a {kind}, not a name; "
                f'quote it ("{text}":) or choose another name'
            )
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        lines = problems(errors, Params)
        if len(lines) == 1:  # the usual case: one line, like every other error
            raise ParamsError(f"{source} is invalid: {lines[0]}") from None
        listing = "\n  ".join(lines)
        raise ParamsError(f"{source} is invalid ({len(errors)} problems):\n  {listing}") from None


# params.yaml is a few KiB. A file beyond these limits is refused before it is built: a YAML
# alias bomb ("billion laughs") is a few lines that expand to billions of values.
MAX_BYTES = 1024 * 1024
MAX_VALUES = 100_000  # scalars, lists and mappings, each alias counted as what it expands to
MAX_DEPTH = 50  # nesting of lists and mappings
TOO_LARGE = f"larger than the {MAX_BYTES // 1024} KiB a params file may have (refused unread)"


class _Bomb(Exception):
    """The document expands to more than MAX_VALUES values (or into itself)."""


def _expanded_size(root: Any) -> int:
    """How many values the node tree under `root` expands to, aliases expanded, without
    expanding them (each node is sized once); raises _Bomb beyond MAX_VALUES or on a cycle."""
    from ruamel.yaml.nodes import MappingNode, SequenceNode

    def children(node: Any) -> list[Any]:
        if isinstance(node, MappingNode):
            return [part for pair in node.value for part in pair]
        return list(node.value) if isinstance(node, SequenceNode) else []

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = size = 1 + sum(sizes[id(c)] for c in children(node))
            if size > MAX_VALUES:
                raise _Bomb(
                    f"it expands to more than {MAX_VALUES} values once its aliases are "
                    "expanded (a params file has a few hundred)"
                )
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise _Bomb("an alias refers to a value that contains it (it would expand forever)")
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in sizes)
    return sizes[id(root)]


def read_yaml(text: str) -> Any:
    """YAML 1.2 into plain values, as DVC reads params.yaml; a ParamsError beyond MAX_BYTES,
    MAX_DEPTH or MAX_VALUES."""
    from ruamel.yaml import YAML
    from ruamel.yaml.composer import MaxDepthExceededError

    if len(text.encode()) > MAX_BYTES:
        raise ParamsError(TOO_LARGE)
    yaml = YAML(typ="safe", pure=True)
    yaml.max_depth = MAX_DEPTH
    constructor, parser = yaml.get_constructor_parser(text)
    try:
        node = constructor.composer.get_single_node()
        if node is None:
            return None
        try:
            _expanded_size(node)
        except _Bomb as exc:
            raise ParamsError(f"refused: {exc}") from None
        try:
            return constructor.construct_document(node)
        except ValueError as exc:  # an integer of more digits than Python converts
            digits = "integer string conversion" in str(exc)
            why = "an integer of more than 4300 digits" if digits else clip(str(exc), 120)
            raise ParamsError(f"a value cannot be read: {why}") from None
    except MaxDepthExceededError:
        raise ParamsError(
            f"refused: lists and mappings nested deeper than {MAX_DEPTH} levels "
            "(a params file needs 4)"
        ) from None
    finally:
        parser.dispose()


def load_params(path: str | Path = "params.yaml") -> Params:
    from ruamel.yaml import YAMLError

    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO blocks open()
        raise ParamsError(
            f"{path}: is a special file (a FIFO, a device or a socket), not a params file; "
            "pass a regular YAML file"
        )
    try:
        with path.open("rb") as file:  # no more than the cap is read, whatever the file
            content = file.read(MAX_BYTES + 1)
        if len(content) > MAX_BYTES:
            raise ParamsError(TOO_LARGE)
        raw = read_yaml(content.decode())
    except FileNotFoundError:
        raise ParamsError(f"{path}: file not found (run from the repository root)") from None
    except IsADirectoryError:
        raise ParamsError(f"{path}: is a folder, not a params file") from None
    except PermissionError:
        raise ParamsError(f"{path}: not readable (check its permissions)") from None
    except UnicodeDecodeError:
        raise ParamsError(f"{path}: not a text file (expected YAML)") from None
    except YAMLError as exc:
        # The parser's problem and where it is ("line 29, column 3: found duplicate key ..."),
        # without its excerpt of the text nor ruamel's advice on silencing checks.
        problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        said = clip(" ".join((where + problem if problem and where else str(exc)).split()), 300)
        raise ParamsError(f"{path}: not valid YAML: {said}") from None
    except ParamsError as exc:
        raise ParamsError(f"{path}: {exc}") from None
    return parse_params(raw, str(path))


def differences(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Where two of a stage's selected inputs differ, as "key: old → new" (dotted keys into
    pydantic models, dataclasses and mappings; other values compared whole)."""
    old, new = _parts(before), _parts(after)
    if old is None or new is None:
        return [] if before == after else [f"{prefix or 'value'}: {echo(before)} → {echo(after)}"]
    out = []
    for key in [*old, *(k for k in new if k not in old)]:
        name = f"{prefix}.{key}" if prefix else str(key)
        if key not in old or key not in new:
            out.append(f"{name}: {echo(old.get(key))} → {echo(new.get(key))}")
        else:
            out.extend(differences(old[key], new[key], name))
    return out


def _parts(value: Any) -> dict[Any, Any] | None:
    """A structured value's parts by name; None for a plain value."""
    if isinstance(value, BaseModel):
        return {name: getattr(value, name) for name in type(value).model_fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return dict(value)
    return None
