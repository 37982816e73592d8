"""One function per pipeline stage: read inputs, call the core, write outputs.

`cli.py` parses arguments and calls these; tests call them directly. Paths come from
dvc.yaml (through the command line), never from constants here.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import data, engine, hardware, profiling, report
from .batches import LoaderBatches, ResidentBatches
from .models import SeedCNN
from .params import Params, TrainParams, VariantParams


class StageError(RuntimeError):
    """A stage cannot do what it was asked; the message says why and what to do."""


def write_json(path: Path, payload: Any) -> None:
    """Write JSON atomically: a crash never leaves a half-written metrics file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- env / download / prepare ------------------------------------------------------------


def env_stage(out_dir: Path) -> dict[str, dict[str, Any]]:
    facts = {"cpu": hardware.cpu_facts(), "cuda": hardware.cuda_facts()}
    for device, payload in facts.items():
        write_json(out_dir / f"{device}.json", payload)
    from . import doctor

    for problem in doctor.diagnose(doctor.gather()).problems:
        log(f"env: WARNING: {problem}")
    gpu = facts["cuda"]
    log(f"env: CPU {facts['cpu']['cpu_model']} ({facts['cpu']['logical_cpus']} logical CPUs)")
    if gpu["cuda_available"]:
        log(f"env: GPU {', '.join(gpu['gpu_names'])}, driver {gpu['nvidia_driver']}")
    else:
        log(f"env: no usable GPU: {gpu['reason']}")
    return facts


def download_stage(params: Params, out_dir: Path) -> list[Path]:
    mirrors = data.mirrors_with_override(params.data.mirrors)
    log(f"download: mirrors in order: {', '.join(mirrors)}")
    paths = data.download_mnist(
        out_dir, mirrors, timeout_s=params.data.timeout_s, retries=params.data.retries
    )
    for path in paths:
        log(f"download: {path.name} verified")
    return paths


def prepare_stage(raw_dir: Path, out_dir: Path) -> dict[str, int]:
    counts = data.prepare(raw_dir, out_dir)
    log(f"prepare: {counts['train']} training and {counts['test']} test images")
    return counts


# --- train --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainOutputs:
    model: Path
    metrics_dir: Path

    @property
    def train_json(self) -> Path:
        return self.metrics_dir / "train.json"

    @property
    def epochs_csv(self) -> Path:
        return self.metrics_dir / "epochs.csv"

    checkpoint: Path | None = None  # per-epoch training state, for resuming after a kill
    profile: Path | None = None  # folder for a torch.profiler trace of steady-state steps


def resolve_device(
    name: str, variant: VariantParams, params: Params
) -> tuple[torch.device | None, str]:
    """The device to train on, or (None, reason) when a CUDA variant must be skipped."""
    if not variant.uses_cuda:
        return torch.device("cpu"), hardware.cpu_model()
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.cuda.get_device_name(0)
    reason = hardware.cuda_unavailable_reason()
    if params.train.require_gpu:
        raise StageError(
            f"variant {name!r} needs CUDA but {reason}. Run on a GPU machine, or set "
            "train.require_gpu: false in params.yaml to record CUDA variants as skipped."
        )
    return None, reason


def build_batches(
    params: Params,
    variant: VariantParams,
    prepared_dir: Path,
    device: torch.device,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[engine.BatchSource, ResidentBatches]:
    """The variant's training batch source and the (resident) test set."""
    train = params.train
    train_split = data.load_split(prepared_dir, "train", train.train_subset)
    test_split = data.load_split(prepared_dir, "test", train.test_subset)
    if variant.batches == "resident":
        train_batches = ResidentBatches(
            train_split,
            device,
            train.batch_size,
            train.seed,
            channels_last=variant.channels_last,
            rank=rank,
            world_size=world_size,
        )
    else:
        train_batches = LoaderBatches(
            prepared_dir,
            len(train_split.labels),
            device,
            train.batch_size,
            train.seed,
            train.loader,
            channels_last=variant.channels_last,
            rank=rank,
            world_size=world_size,
        )
    test_batches = ResidentBatches(
        test_split,
        device,
        train.eval_batch_size,
        train.seed,
        shuffle=False,
        channels_last=variant.channels_last,
    )
    return train_batches, test_batches


def _run_params(name: str, params: Params, variant: VariantParams) -> dict[str, Any]:
    return {"variant": {"name": name, **variant.model_dump()}, "train": params.train.model_dump()}


def _write_epochs_csv(path: Path, records: list[engine.EpochRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r.as_dict() for r in records]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["epoch"])
        writer.writeheader()
        writer.writerows(rows)


def _skip(
    name: str, reason: str, params: Params, variant: VariantParams, out: TrainOutputs, root: Path
) -> dict:
    from . import tracking

    log(f"train {name}: skipped: {reason}")
    with tracking.variant_run(
        root, name, _run_params(name, params, variant), {"status": "skipped"}
    ) as run_id:
        tracking.log_metrics({"skipped": 1})
        tracking.set_tag("skip_reason", reason)
    metrics = {"status": "skipped", "reason": reason, "device": variant.device}
    write_json(out.train_json, metrics)
    _write_epochs_csv(out.epochs_csv, [])
    out.model.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"status": "skipped", "reason": reason, "variant": name, "mlflow_run_id": run_id}, out.model
    )
    return metrics


def _launch_distributed(name: str, variant: VariantParams, params: Params, argv: list[str]) -> dict:
    """Re-run this same `accelbench train` command under torchrun, once per process."""
    cfg = variant.distributed
    local = cfg.nproc_per_node
    if variant.uses_cuda and torch.cuda.device_count() < local:
        reason = (
            f"variant {name!r} asks for {local} GPUs per node (distributed.nproc_per_node) but "
            f"this machine has {torch.cuda.device_count()}"
            + ("" if torch.cuda.is_available() else f" ({hardware.cuda_unavailable_reason()})")
        )
        if params.train.require_gpu:
            raise StageError(
                f"{reason}. Lower distributed.nproc_per_node or run on a bigger machine."
            )
        return {"status": "skip", "reason": reason}
    if cfg.nnodes == 1:
        rendezvous = ["--standalone"]
    else:
        rendezvous = [
            f"--nnodes={cfg.nnodes}",
            f"--node-rank={cfg.node_rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        ]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={local}",
        *rendezvous,
        "--max-restarts=0",
        "--monitor-interval=1",
        "-m",
        "accelbench.cli",
        *argv,
    ]
    log(f"train {name}: launching {cfg.world_size} processes: torchrun {' '.join(command[3:])}")
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        raise StageError(
            f"variant {name!r}: torchrun exited with {result.returncode}; its report above names "
            "the failed rank and its exit code or signal"
        )
    return {"status": "launched"}


def train_stage(
    root: Path,
    params: Params,
    name: str,
    prepared_dir: Path,
    out: TrainOutputs,
    *,
    quiet: bool = False,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """Train one variant; write its checkpoint, metrics JSON and per-epoch CSV.

    A distributed variant re-launches this command under torchrun (`argv`); each process
    then trains its share, and rank 0 alone writes outputs and the MLflow run.
    """
    variant = params.variant(name)
    in_torchrun = "LOCAL_RANK" in os.environ
    if variant.distributed is not None and not in_torchrun:
        launched = _launch_distributed(name, variant, params, argv or [])
        if launched["status"] == "skip":
            return _skip(name, launched["reason"], params, variant, out, root)
        if variant.distributed.node_rank != 0:
            log(
                f"train {name}: node {variant.distributed.node_rank} done; node 0 writes the outputs"
            )
            return {}
        return json.loads(out.train_json.read_text())
    if variant.distributed is None:
        device, device_name = resolve_device(name, variant, params)
        if device is None:
            return _skip(name, device_name, params, variant, out, root)
        return _train(root, params, name, variant, device, device_name, prepared_dir, out, quiet)

    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    backend = variant.distributed.backend
    if backend == "auto":
        backend = "nccl" if variant.uses_cuda else "gloo"
    if variant.uses_cuda:
        torch.cuda.set_device(local_rank)
        device, device_name = (
            torch.device("cuda", local_rank),
            torch.cuda.get_device_name(local_rank),
        )
    else:
        device, device_name = torch.device("cpu"), hardware.cpu_model()
    dist.init_process_group(backend)
    try:
        return _train(
            root,
            params,
            name,
            variant,
            device,
            device_name,
            prepared_dir,
            out,
            quiet,
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
        )
    finally:
        dist.destroy_process_group()


def _train(
    root: Path,
    params: Params,
    name: str,
    variant: VariantParams,
    device: torch.device,
    device_name: str,
    prepared_dir: Path,
    out: TrainOutputs,
    quiet: bool,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, Any]:
    from . import tracking

    main_process = rank == 0
    train = params.train
    engine.configure_backends(variant, train.deterministic)
    flops_per_sample = engine.train_flops_per_sample(SeedCNN(dropout=train.dropout))
    model = _fresh_model(train, variant, device)

    train_batches, test_batches = build_batches(
        params, variant, prepared_dir, device, rank=rank, world_size=world_size
    )
    tags = {
        "status": "trained",
        "device": variant.device,
        "device_name": device_name,
        "torch": torch.__version__,
        "cuda_runtime": str(torch.version.cuda),
        "precision": variant.precision,
        "world_size": str(world_size),
    }
    if main_process:
        log(
            f"train {name}: {device_name}, {variant.precision}, {variant.batches} batches, "
            f"{train_batches.num_samples} samples x {train.epochs} epochs, batch {train.batch_size}"
            + (f" over {world_size} processes" if world_size > 1 else "")
        )
    run_params = _run_params(name, params, variant)
    fingerprint = hashlib.sha256(json.dumps(run_params, sort_keys=True).encode()).hexdigest()
    checkpoint = out.checkpoint if world_size == 1 else None  # DDP runs start over
    resume = _load_checkpoint(checkpoint, fingerprint, name)
    if out.profile is not None:
        _check_profile_request(name, train, len(train_batches), resume)
    if not main_process:
        tracked = contextlib.nullcontext(None)
    elif resume and resume["mlflow_run_id"]:
        tracked = tracking.resume_run(root, resume["mlflow_run_id"])  # one variant, one run
    else:
        tracked = tracking.variant_run(root, name, run_params, tags, system_metrics=True)
    with tracked as run_id:

        def save_checkpoint(state: dict[str, Any]) -> None:
            _atomic_save(
                {"fingerprint": fingerprint, "mlflow_run_id": run_id, "state": state}, checkpoint
            )

        if main_process and resume is None:
            for split, limit, context in (
                ("train", train.train_subset, "training"),
                ("test", train.test_subset, "evaluation"),
            ):
                arrays = data.load_split(prepared_dir, split, limit)
                digest = data.dataset_digest(split, limit)
                tracking.log_dataset(
                    f"mnist-{split}", arrays.images, arrays.labels, prepared_dir, digest, context
                )
        progress = report.EpochProgress(
            name, train.epochs, len(train_batches), quiet=quiet or not main_process
        )

        def on_epoch(record: engine.EpochRecord) -> None:
            progress.epoch_done(record)
            if main_process:
                tracking.log_metrics(record.as_dict(), step=record.epoch)

        accumulation = train.accumulation_steps
        energy_j = hardware.gpu_energy_reader(device.index or 0) if variant.uses_cuda else None
        for attempt in range(train.oom_retries + 1):
            try:
                # one profile per attempt: an OOM retry starts counting steps again
                with profiling.step_profiler(
                    out.profile, name, rank, len(train_batches), cuda=variant.uses_cuda
                ) as profile_step:

                    def on_step(samples: int, profile_step=profile_step) -> None:
                        progress.step(samples)
                        profile_step()

                    records = engine.fit(
                        model,
                        train_batches,
                        test_batches,
                        train.model_copy(update={"accumulation_steps": accumulation}),
                        variant,
                        device,
                        on_epoch=on_epoch,
                        on_step=on_step,
                        energy_j=energy_j,
                        resume_from=resume["state"] if resume else None,
                        on_checkpoint=save_checkpoint if checkpoint else None,
                    )
                break
            except torch.cuda.OutOfMemoryError as exc:
                per_pass = train.batch_size // world_size // accumulation
                if attempt == train.oom_retries or per_pass < 2:
                    message = _oom_message(name, train, accumulation, device, device_name)
                    raise StageError(message) from exc
                accumulation *= 2
                log(
                    f"train {name}: CUDA out of memory at {per_pass} samples per pass; "
                    f"retrying from scratch with accumulation_steps {accumulation} "
                    f"({per_pass // 2} per pass, same batch {train.batch_size})"
                )
                model, resume = _fresh_model(train, variant, device), None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        progress.close()
        if not main_process:
            return {}
        summary = engine.summarize(records, train.target_accuracy)
        steady_s = summary["steady_epoch_s"] or summary["first_epoch_s"]
        summary.update(
            status="trained",
            accumulation_steps=accumulation,
            device=variant.device,
            device_name=device_name,
            precision=variant.precision,
            batches=variant.batches,
            world_size=world_size,
            train_samples=records[-1].samples,
            flops_per_sample=flops_per_sample,
            steady_tflops=flops_per_sample * records[-1].samples / steady_s / 1e12,
            peak_tflops=hardware.peak_tflops(device_name, variant.precision, variant.tf32),
            peak_host_rss_mib=engine.peak_host_rss_mib(),
        )
        if world_size > 1 and summary["steady_samples_per_s"]:
            summary["steady_samples_per_s_per_process"] = (
                summary["steady_samples_per_s"] / world_size
            )
        if summary["peak_tflops"]:
            summary["peak_share"] = summary["steady_tflops"] / (summary["peak_tflops"] * world_size)
        write_json(out.train_json, summary)
        _write_epochs_csv(out.epochs_csv, records)
        out.model.parent.mkdir(parents=True, exist_ok=True)
        final = {
            "status": "trained",
            "variant": name,
            "params": run_params,
            "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "mlflow_run_id": run_id,
        }
        _atomic_save(final, out.model)
        tracking.log_metrics({k: v for k, v in summary.items() if k != "epochs"})
        tracking.log_artifact(out.epochs_csv)
        for path in sorted(out.profile.glob(f"{name}-rank0.*")) if out.profile else ():
            tracking.log_artifact(path, "profile")
        example = test_batches.images[:4].float().cpu().contiguous().numpy()
        tracking.log_model(_cpu_model(final), example)
    log(
        f"train {name}: first epoch {summary['first_epoch_s']:.2f} s, steady "
        f"{report.fmt_seconds(summary['steady_epoch_s'])}, test accuracy "
        f"{summary['final_test_accuracy']:.2%}"
    )
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)  # finished: the outputs are the record now
    return summary


def _check_profile_request(
    name: str, train: TrainParams, steps_per_epoch: int, resume: dict[str, Any] | None
) -> None:
    """--profile records the second epoch this run trains: refuse what cannot reach it."""
    try:
        profiling.profile_window(steps_per_epoch, 1)
    except ValueError:
        raise StageError(
            f"--profile: an epoch of {name!r} has {steps_per_epoch} steps; profiling needs at "
            f"least {profiling.MIN_STEPS_PER_EPOCH} (lower train.batch_size)"
        ) from None
    done = resume["state"]["epochs_done"] if resume else 0
    if train.epochs - done < 2:
        resuming = f", resuming after epoch {done}" if done else ""
        raise StageError(
            f"--profile records the second epoch this run trains, but {name!r} has "
            f"{train.epochs - done} left (train.epochs {train.epochs}{resuming}); raise "
            "train.epochs or drop --profile"
        )


def _fresh_model(train: TrainParams, variant: VariantParams, device: torch.device) -> SeedCNN:
    """The seeded initial model, on its device: the same weights for every variant."""
    engine.seed_everything(train.seed)
    memory_format = torch.channels_last if variant.channels_last else torch.preserve_format
    return SeedCNN(dropout=train.dropout).to(device, memory_format=memory_format)


def _oom_message(
    name: str, train: TrainParams, accumulation: int, device: torch.device, device_name: str
) -> str:
    total = (
        f"{torch.cuda.get_device_properties(device).total_memory / 2**30:.1f} GiB"
        if device.type == "cuda"
        else "n/a"
    )
    return (
        f"variant {name!r}: CUDA out of memory with batch {train.batch_size} "
        f"({train.batch_size // accumulation} samples per forward/backward pass) on "
        f"{device_name} ({total}). Lower train.batch_size, or raise train.accumulation_steps "
        "(same effective batch, less memory), or set train.oom_retries: N to let the stage "
        "halve the per-pass batch itself."
    )


def _atomic_save(payload: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary file, then rename: a kill mid-save keeps the previous file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path | None, fingerprint: str, name: str) -> dict[str, Any] | None:
    """The saved training state if it belongs to these exact params, else None."""
    if path is None or not path.is_file():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("fingerprint") != fingerprint:
        log(f"train {name}: {path} is from other params; starting from epoch 1")
        return None
    log(f"train {name}: resuming after epoch {saved['state']['epochs_done']} from {path}")
    return saved


def _cpu_model(checkpoint: dict[str, Any]) -> SeedCNN:
    model = SeedCNN()  # dropout is inactive in eval mode
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval()


# --- evaluate -----------------------------------------------------------------------------


def evaluate_stage(
    root: Path, params: Params, model_path: Path, prepared_dir: Path, metrics_dir: Path
) -> dict[str, Any]:
    from sklearn.metrics import classification_report, confusion_matrix

    from . import tracking

    checkpoint = torch.load(model_path, map_location="cpu", weights_only=True)
    name = checkpoint["variant"]
    eval_json = metrics_dir / "eval.json"
    confusion_csv = metrics_dir / "confusion.csv"
    confusion_png = metrics_dir / "confusion.png"
    if checkpoint["status"] != "trained":
        payload = {"status": checkpoint["status"], "reason": checkpoint.get("reason")}
        write_json(eval_json, payload)
        report.write_confusion_csv(confusion_csv, None)
        report.placeholder_figure(
            confusion_png, f"{name}: {checkpoint['status']}\n{checkpoint.get('reason', '')}"
        )
        log(f"evaluate {name}: {checkpoint['status']}")
        return payload

    variant = VariantParams.model_validate(
        {k: v for k, v in checkpoint["params"]["variant"].items() if k != "name"}
    )
    device, _ = resolve_device(name, variant, params)
    if device is None:
        raise StageError(
            f"evaluate {name}: the model was trained on CUDA, which is not available here"
        )
    engine.configure_backends(variant)
    model = _cpu_model(checkpoint).to(device)
    test_split = data.load_split(prepared_dir, "test", params.train.test_subset)
    batches = ResidentBatches(test_split, device, params.train.eval_batch_size, 0, shuffle=False)
    engine.evaluate(model, batches, variant, device)  # warm-up: kernels, autotuning
    result = engine.evaluate(model, batches, variant, device)
    y_true, y_pred = result.targets.numpy(), result.predictions.numpy()
    per_class = classification_report(y_true, y_pred, output_dict=True, zero_division=0)
    matrix = confusion_matrix(y_true, y_pred, labels=list(range(10)))
    payload = {
        "status": "trained",
        "test_accuracy": result.accuracy,
        "test_loss": result.loss,
        "macro_f1": per_class["macro avg"]["f1-score"],
        "inference_samples_per_s": result.samples_per_s,
        "per_class": {
            str(c): {m: per_class[str(c)][m] for m in ("precision", "recall", "f1-score")}
            for c in range(10)
            if str(c) in per_class
        },
    }
    write_json(eval_json, payload)
    report.write_confusion_csv(confusion_csv, (y_true, y_pred))
    report.confusion_figure(confusion_png, matrix, f"{name}: confusion matrix (test set)")
    if not checkpoint.get("mlflow_run_id"):
        log(f"evaluate {name}: training was not tracked in MLflow; results are in {eval_json}")
        return payload
    # Tracking calls are tolerant: a store reset since training is reported once, as an outage.
    with tracking.resume_run(root, checkpoint["mlflow_run_id"]):
        tracking.log_metrics(
            {
                "eval_test_accuracy": result.accuracy,
                "eval_test_loss": result.loss,
                "eval_macro_f1": payload["macro_f1"],
                "inference_samples_per_s": result.samples_per_s,
            }
        )
        tracking.log_artifact(confusion_png)
        tracking.log_artifact(eval_json)
    log(f"evaluate {name}: test accuracy {result.accuracy:.2%}, macro F1 {payload['macro_f1']:.4f}")
    return payload


# --- compare ------------------------------------------------------------------------------


def compare_stage(
    root: Path, params: Params, env_dir: Path, metrics_dir: Path, out_dir: Path
) -> dict[str, Any]:
    from . import tracking

    env = {d: json.loads((env_dir / f"{d}.json").read_text()) for d in ("cpu", "cuda")}
    rows = []
    for name, variant in params.variants.items():
        train_metrics = json.loads((metrics_dir / name / "train.json").read_text())
        eval_metrics = json.loads((metrics_dir / name / "eval.json").read_text())
        epochs = report.read_epochs_csv(metrics_dir / name / "epochs.csv")
        rows.append(report.Row(name, variant, train_metrics, eval_metrics, epochs))
    result = report.write_report(out_dir, rows, env, params.train)
    run_id = tracking.finish_pipeline(root, result.files, result.headline)
    if run_id:
        log(f"compare: report logged to MLflow pipeline run {run_id}")
    log(f"compare: wrote {out_dir / 'comparison.md'}")
    return result.headline
