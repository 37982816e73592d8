"""train@V: train one variant; write its model file, `train.json`, `epochs.csv` and its
portable compile cache (`training/compile_cache.py`).

`placement.place` decides where: here, skipped, or re-launched under torchrun (rank 0 alone
writes the outputs and the MLflow run). `training.loop.train` trains, given a `TrainJob` and
hooks that record the timing phases and rank 0's MLflow run; a skipped variant imports neither
MLflow nor the model code. Before CUDA starts, a training takes its GPUs, or the CPU, on this
host (`slots.tenancy` waits while other stages hold them); train.json says what else ran there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.core import phases
from accelbench.core.console import log
from accelbench.core.outputs import (
    Kind,
    MetricsFiles,
    claim,
    refuse_foreign,
    refuse_foreign_folder,
    remove_leftovers,
    staged,
    write_json,
)
from accelbench.core.params import Params, TrainRecipe, VariantParams
from accelbench.core.results import (
    EpochRecord,
    ModelFile,
    Skipped,
    TrainResult,
    TrainSummary,
    read,
    write_epochs_csv,
)
from accelbench.data import prepared
from accelbench.data.datasets import Dataset, by_name
from accelbench.system import lifetime, slots
from accelbench.training import compile_cache, placement, torchrun
from accelbench.training.job import TrainHooks, TrainJob, TrainOutputs, run_params

if TYPE_CHECKING:
    import torch

    from accelbench.training.checkpoint import Resume

# Read only to refuse a run, never to shape an output: not in dvc.yaml (the env stage
# enforces it on every repro).
CHECKS = ("train.require_gpu",)
CHECKPOINT = Kind("a training checkpoint", lambda path: True)


@dataclass(frozen=True)
class TrainInputs:
    recipe: TrainRecipe
    variant: VariantParams
    dataset: Dataset
    require_gpu: bool


def select(params: Params, name: str) -> TrainInputs:
    train, variant = params.train, params.variant(name)
    recipe = {key: getattr(train, key) for key in TrainRecipe.model_fields}
    recipe["epochs"] = variant.epochs or train.epochs  # a variant's own, where it sets them
    recipe["repeats"] = variant.repeats or train.repeats
    return TrainInputs(
        TrainRecipe(**recipe), variant, by_name(params.data.dataset), train.require_gpu
    )


def run(
    root: Path,
    name: str,
    inputs: TrainInputs,
    prepared_dir: Path,
    out: TrainOutputs,
    *,
    quiet: bool = False,
    argv: list[str] | None = None,
    locks: tuple[int, ...] = (),
) -> TrainResult | None:
    """Train (or skip) one variant; None in a process that writes no outputs. `locks`: the
    file descriptors of `lifetime.sole_writer`'s locks, which torchrun's workers hold too."""
    claim(out.model, out.metrics.train_json, out.metrics.epochs_csv)  # before any work
    if out.checkpoint is not None:  # any file is read (one not ours is set aside); never a FIFO
        refuse_foreign(out.checkpoint, CHECKPOINT)
    if out.compile_cache is not None:
        refuse_foreign(out.compile_cache, compile_cache.KIND)
    variant = inputs.variant
    # a torchrun worker's launcher took its GPUs
    needed = 0 if placement.torchrun_child(variant) else placement.gpus_needed(variant)
    with phases.phase("device"):  # NVML alone where it settles a skip: nothing to wait for
        here = placement.nvml_visible(needed) if needed else None
    takes = needed if here is None else 0
    # a CPU training takes its turn on the host; not a multi-node one, whose "nodes" may share
    # one host (127.0.0.1): each would wait for the other's turn forever
    multi_node = variant.distributed is not None and variant.distributed.nnodes > 1
    cpu = variant.device == "cpu" and not multi_node
    with slots.tenancy(name, stage="train", gpus=takes, cpu=cpu) as tenancy:
        if takes and out.compile_cache is not None:  # before the driver reads its JIT cache
            with phases.phase("step_setup"):
                jit = compile_cache.use_variant_jit_folder(root, name)
                restored = compile_cache.restore_jit(out.compile_cache, jit, root)
            if restored:
                log(f"train {name}: {restored}")
        with phases.phase("device"):  # CUDA starts here, on the GPUs taken
            if here is None:
                with phases.phase("imports"):
                    import torch  # noqa: F401  (placement and training need it)
                # as torch sees them, in CUDA_VISIBLE_DEVICES as slots.tenancy narrowed it
                here = placement.torch_visible() if needed else None
            where = placement.place(name, variant, require_gpu=inputs.require_gpu, here=here)
        if where.skip_reason is not None:
            return record_skip(name, inputs, where.skip_reason, out)
        if where.launch:
            return _launch(name, variant, out, argv or [], locks + tenancy.fds, tenancy.shared)
        job = TrainJob(name, inputs.recipe, variant, inputs.dataset, prepared_dir, where, out, root)
        with phases.phase("imports"):  # MLflow and the model code: only to train
            from accelbench.training import build
            from accelbench.training.loop import train

            hooks = _Tracked(job, quiet) if where.main else _Timed()
        build.check_prepared(inputs.dataset, prepared_dir)
        with torchrun.process_group(where, variant.distributed):
            summary = train(job, hooks)
        return record_sharing(summary, tenancy.shared(), out)


class _Timed(TrainHooks):
    """A training's phases, into the stage's timing (`core.phases`)."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return phases.phase(name)


class _Tracked(_Timed):
    """Rank 0's hooks: the phases, the progress (unless `quiet`), the variant's MLflow run."""

    def __init__(self, job: TrainJob, quiet: bool) -> None:
        import torch

        from accelbench.system import tracking  # MLflow: only to train
        from accelbench.training import build

        self.job, self.quiet, self.tracking, self.build = job, quiet, tracking, build
        self.tags = {
            "status": "trained",
            "device": job.variant.device,
            "device_name": job.placement.device_name,
            "torch": torch.__version__,
            "cuda_runtime": str(torch.version.cuda),
            "precision": job.variant.precision,
            "world_size": str(job.placement.world_size),
        }

    @contextlib.contextmanager
    def run(self, resume: Resume | None) -> Iterator[str | None]:
        job, tracking = self.job, self.tracking
        if resume is not None and resume.mlflow_run_id:  # one variant, one run
            with tracking.resume_run(job.root, resume.mlflow_run_id) as run_id:
                yield run_id
            return
        with tracking.variant_run(
            job.root, job.name, job.run_params, self.tags, system_metrics=True
        ) as run_id:
            if resume is None:
                with phases.phase("mlflow"):
                    self._log_datasets()
            yield run_id

    def _log_datasets(self) -> None:
        job, folder = self.job, self.job.prepared_dir
        for split, limit, context in (
            ("train", job.recipe.train_subset, "training"),
            ("test", job.recipe.test_subset, "evaluation"),
        ):
            arrays = prepared.load_split(folder, split, limit)
            digest = prepared.dataset_digest(folder, split, limit)
            name = f"{job.dataset.name}-{split}"
            self.tracking.log_dataset(name, arrays.images, arrays.labels, folder, digest, context)

    def on_epoch(self, record: EpochRecord) -> None:
        self.tracking.log_metrics(record.metrics(), step=record.epoch)

    def trained(self, summary: TrainSummary, model: ModelFile, examples: torch.Tensor) -> None:
        job, tracking = self.job, self.tracking
        tracking.log_metrics(summary.metrics())
        tracking.log_artifact(job.out.metrics.epochs_csv)
        profile = job.out.profile
        for path in sorted(profile.glob(f"{job.name}-rank0.*")) if profile else ():
            tracking.log_artifact(path, "profile")
        example = examples.float().cpu().contiguous().numpy()
        trained = self.build.trained_model(job.dataset, model.state_dict)
        tracking.log_model(trained, example, job.name)


def _launch(
    name: str,
    variant: VariantParams,
    out: TrainOutputs,
    argv: list[str],
    keep_fds: tuple[int, ...],
    shared: Callable[[], str | None],
) -> TrainResult | None:
    """Train under torchrun, which re-runs this command in its workers; node 0's outputs, with
    what else ran on this host meanwhile (`shared`)."""
    cfg = variant.distributed
    with phases.phase("launch"):
        torchrun.launch(name, cfg, argv, keep_fds=keep_fds)
    if cfg.node_rank != 0:
        log(f"train {name}: node {cfg.node_rank} done; node 0 writes the outputs")
        return None
    return record_sharing(read(TrainResult, out.metrics.train_json), shared(), out)


def record_sharing(
    summary: TrainResult | None, note: str | None, out: TrainOutputs
) -> TrainResult | None:
    """`summary`, and its train.json, with what else ran on this host while it trained
    (`shared_machine`: the report prints it). The stage's timing gets its timed epochs and
    its repeats' wall time: a torchrun launcher's, its workers'."""
    if isinstance(summary, TrainSummary):
        phases.RECORDER.training_s = summary.timed_s
        phases.RECORDER.repeats_s = summary.repeats_wall_s
    if note is None or not isinstance(summary, TrainSummary):
        return summary
    shared = replace(summary, shared_machine=note)
    with phases.phase("outputs"), staged() as outputs:  # the old file, or the new, whole
        write_json(outputs(out.metrics.train_json), shared.to_json())
    return shared


def record_skip(name: str, inputs: TrainInputs, reason: str, out: TrainOutputs) -> Skipped:
    """A variant this machine cannot run: its outputs say so, and why (compare logs it)."""
    log(f"train {name}: skipped: {reason}")
    remove_leftovers(out.model, out.metrics.train_json, out.metrics.epochs_csv)
    params = run_params(name, inputs.recipe, inputs.variant, dataset=None)  # read no data
    skipped = Skipped(reason, inputs.variant.device)
    with phases.phase("outputs"), staged() as outputs:
        write_json(outputs(out.metrics.train_json), skipped.to_json())
        write_epochs_csv(outputs(out.metrics.epochs_csv), [])
        model_file = ModelFile(name, "skipped", None, params=params, reason=reason)
        model_file.save(outputs(out.model))
        if out.compile_cache is not None and not out.compile_cache.is_file():
            # DVC expects the output; a cache already here (pulled from a machine that
            # trained the variant) is kept for the next machine that can
            compile_cache.save(outputs(out.compile_cache, compile_cache.KIND), None)
    return skipped


def _model_path(text: str) -> Path:
    """--model: NAME.pt (an output's name says what may be replaced at that path)."""
    path = Path(text)
    if path.suffix != ".pt":
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a .pt file name; accelbench writes a model as NAME.pt"
        )
    return path


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("variant")
    parser.add_argument("--data", type=Path, required=True, help="prepared data folder")
    parser.add_argument(
        "--model", type=_model_path, required=True, help="model file to write (NAME.pt)"
    )
    parser.add_argument("--metrics", type=Path, required=True, help="folder for metrics files")
    parser.add_argument(
        "--checkpoint", type=Path, help="training state saved every epoch; resumed when present"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record a torch.profiler trace of up to 20 full-batch steps of epoch 2 into DIR; "
        "slows this run, so its times are not figures of record",
    )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        metavar="FILE",
        help="torch.compile's portable cache: loaded before a compiled variant compiles (when "
        "made with the same torch, Triton, GPU and step code), rewritten after it trains",
    )


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    phases.RECORDER.stage = f"train@{args.variant}"
    inputs = select(params, args.variant)
    if inputs.recipe.deterministic:
        from accelbench.training.engine import request_determinism

        request_determinism(os.environ)  # before anything touches the GPU
    out = TrainOutputs(
        args.model, MetricsFiles(args.metrics), args.checkpoint, args.profile, args.compile_cache
    )
    for output in filter(None, (out.model, out.checkpoint)):  # a loop has no room for a lock
        refuse_foreign_folder(output.parent)
    with lifetime.sole_writer(args.variant, out.model, out.checkpoint) as locks:
        run(
            root,
            args.variant,
            inputs,
            args.data,
            out,
            quiet=args.quiet,
            argv=args.argv,
            locks=locks,
        )
