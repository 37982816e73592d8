"""A variant's training in this process: the model and batches, the fit (retried after an
out-of-memory error, resumed from a checkpoint) and the outputs.

The train stage (`stages/train.py`) decides where a variant runs, imports this module only
to train, and hands it the `TrainHooks` that time its phases and track its MLflow run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from accelbench.core.console import log
from accelbench.core.outputs import remove_leftovers, staged, write_json
from accelbench.core.progress import EpochProgress, fmt_seconds
from accelbench.core.results import EpochRecord, ModelFile, TrainSummary, write_epochs_csv
from accelbench.core.timing import Heartbeat
from accelbench.data.batches import Batches, ResidentBatches
from accelbench.system import hardware
from accelbench.training import build, compile_cache, engine, profiling
from accelbench.training.checkpoint import Checkpointer, Resume
from accelbench.training.job import TrainHooks, TrainJob
from accelbench.training.oom import retry_on_oom
from accelbench.training.run_summary import summarize_run

FLOPS_CACHE = Path(".accelbench") / "flops.json"  # the model's FLOPs, counted once


def train(job: TrainJob, hooks: TrainHooks) -> TrainSummary | None:
    """Train `job`'s variant here; its summary, or None in a process that writes no outputs."""
    recipe, variant, placement, out = job.recipe, job.variant, job.placement, job.out
    with hooks.phase("device"):
        engine.configure_backends(variant, recipe.deterministic)
        engine.start_device(placement.device)
    fitting = _Fitting.build(job, hooks)
    cache_key = compile_cache.key_for(variant, placement.device) if out.compile_cache else None
    loaded = _load_compile_cache(job, hooks, cache_key)
    with hooks.phase("model"):
        flops = build.flops_per_sample(job.dataset, fitting.model, job.root / FLOPS_CACHE)
    steps = len(fitting.batches)
    if placement.main:
        log(
            f"train {job.name}: {placement.device_name}, {variant.precision}, {variant.batches} "
            f"batches, {fitting.batches.num_samples} samples x {recipe.epochs} epochs, batch "
            f"{recipe.batch_size}"
            + (f" over {placement.world_size} processes" if placement.world_size > 1 else "")
        )
        remove_leftovers(out.model, out.metrics.train_json, out.metrics.epochs_csv)
    path = out.checkpoint if placement.world_size == 1 else None  # DDP starts over
    checkpointer = Checkpointer(path, job.run_params, job.name, device=placement.device_name)
    with hooks.phase("checkpoint"):
        resume = checkpointer.load(fitting.model)
    if out.profile is not None:
        profiling.check_request(job.name, recipe.epochs, steps, resume.epochs_done if resume else 0)
    with hooks.run(resume) as run_id:
        # a DataLoader's workers end with the trainings, not at the process's exit
        with contextlib.closing(fitting.batches):
            progress = hooks.progress(job.name, recipe.epochs, steps)
            with hooks.phase("training"):
                records, accumulation = fitting.fit(progress, resume, checkpointer.saver(run_id))
            progress.close()
            # before repeats find every graph cached
            cache_state = compile_cache.state(compile_cache.counts(), loaded)
            state_dict = {k: v.detach().cpu() for k, v in fitting.model.state_dict().items()}
            started = time.perf_counter()
            with hooks.phase("training"):
                repeats = fitting.repeat(recipe.repeats - 1, accumulation)
            repeats_wall_s = time.perf_counter() - started
        if not placement.main:
            return None
        summary = summarize_run(
            records,
            variant,
            placement,
            accumulation_steps=accumulation,
            flops_per_sample=flops,
            repeats=repeats,
            repeats_wall_s=repeats_wall_s,
            compile_cache=cache_state,
        )
        model_file = ModelFile(job.name, "trained", run_id, job.run_params, state_dict)
        _write_outputs(job, hooks, summary, records, model_file, cache_key)
        hooks.trained(summary, model_file, fitting.test_batches.images[:4])
    log(
        f"train {job.name}: first epoch {summary.first_epoch_s:.2f} s, steady "
        f"{fmt_seconds(summary.steady_epoch_s)}, test accuracy "
        f"{summary.final_test_accuracy:.2%}"
    )
    checkpointer.discard()
    return summary


def _load_compile_cache(
    job: TrainJob, hooks: TrainHooks, key: compile_cache.CacheKey | None
) -> compile_cache.Loaded:
    """The portable compile cache's graphs, before the first step compiles (said on rank 0)."""
    if key is None:
        return compile_cache.Loaded()
    with hooks.phase("step_setup"):
        loaded = compile_cache.load(job.out.compile_cache, key, job.root)
    if not job.placement.main:
        return loaded
    if loaded.reason:
        log(f"train {job.name}: {loaded.reason}")
    elif loaded.artifacts:
        log(
            f"train {job.name}: compile cache {job.out.compile_cache}: {loaded.artifacts} "
            f"entries, {loaded.added} graphs new here (loaded in {loaded.seconds:.2f} s)"
        )
    return loaded


def _write_outputs(
    job: TrainJob,
    hooks: TrainHooks,
    summary: TrainSummary,
    records: list[EpochRecord],
    model_file: ModelFile,
    cache_key: compile_cache.CacheKey | None,
) -> None:
    """train.json, epochs.csv, the model file and the portable compile cache: all new or all
    old."""
    out = job.out
    with hooks.phase("outputs"), staged() as outputs:
        write_json(outputs(out.metrics.train_json), summary.to_json())
        write_epochs_csv(outputs(out.metrics.epochs_csv), records)
        model_file.save(outputs(out.model))
        if out.compile_cache is not None:
            on_gpu = job.placement.device.type == "cuda"  # cuDNN's JIT-built engines too
            jit = compile_cache.jit_folder(job.root) if on_gpu else None
            compile_cache.save(outputs(out.compile_cache, compile_cache.KIND), cache_key, jit)


@dataclass
class _Fitting:
    """A job's model and batches in this process, and how they are fitted: once, or again
    from scratch after each CUDA out-of-memory error (`oom.retry_on_oom`)."""

    job: TrainJob
    hooks: TrainHooks
    model: torch.nn.Module  # replaced by each training from scratch
    batches: Batches
    test_batches: ResidentBatches
    heartbeat: Heartbeat = field(default_factory=Heartbeat)  # what stopped each epoch

    @classmethod
    def build(cls, job: TrainJob, hooks: TrainHooks) -> _Fitting:
        dataset, recipe, variant, placement = job.dataset, job.recipe, job.variant, job.placement
        device = placement.device
        with hooks.phase("model"):
            model = build.fresh_model(dataset, recipe, variant, device)
        shard = {"rank": placement.rank, "world_size": placement.world_size}
        with hooks.phase("data"):
            batches = build.train_batches(
                dataset, recipe, variant, job.prepared_dir, device, **shard
            )
            test_batches = build.eval_batches(
                dataset,
                job.prepared_dir,
                device,
                recipe.eval_batch_size,
                recipe.test_subset,
                channels_last=variant.channels_last,
            )
        return cls(job, hooks, model, batches, test_batches)

    def fit(
        self,
        progress: EpochProgress,
        resume: Resume | None,
        save_checkpoint: Callable[[engine.TrainingState], None] | None,
    ) -> tuple[list[EpochRecord], int]:
        """Epoch records, and the accumulation steps they were trained with."""
        recipe = self.job.recipe

        def attempt(accumulation_steps: int, fresh: bool) -> list[EpochRecord]:
            # after an OOM: from scratch, the checkpoint's state left behind
            seed = recipe.seed if fresh else None
            resume_from = resume.state if resume and not fresh else None
            return self._fit_once(
                progress, accumulation_steps, seed, resume_from, save_checkpoint, track=True
            )

        return retry_on_oom(
            attempt,
            name=self.job.name,
            batch_size=recipe.batch_size,
            accumulation_steps=recipe.accumulation_steps,
            retries=recipe.oom_retries,
            placement=self.job.placement,
        )

    def repeat(self, count: int, accumulation_steps: int) -> list[list[EpochRecord]]:
        """`count` more trainings from scratch (`train.repeats`) at the seeds after the run's,
        with its recipe and accumulation; their epochs are not tracked, and the run's model
        must be taken before (this replaces it)."""
        job = self.job
        repeats = []
        for index in range(count):
            seed = job.recipe.seed + index + 1
            self.batches.seed = seed
            name = f"{job.name} repeat {index + 2}/{count + 1}"
            progress = self.hooks.progress(name, job.recipe.epochs, len(self.batches))
            repeats.append(self._fit_once(progress, accumulation_steps, seed, track=False))
            progress.close()
        return repeats

    def _fit_once(
        self,
        progress: EpochProgress,
        accumulation_steps: int,
        seed: int | None,
        resume_from: engine.TrainingState | None = None,
        save_checkpoint: Callable[[engine.TrainingState], None] | None = None,
        *,
        track: bool,
    ) -> list[EpochRecord]:
        """One training: of the model as it is (`seed` None), or of a new one seeded with
        `seed`; its epochs logged to the run where `track`."""
        job = self.job
        variant, placement = job.variant, job.placement
        device = placement.device
        # energy: NVML's counter (a CUDA variant's GPU), RAPL's (the host's share); None: unreadable
        with self.hooks.phase("device"):
            cuda = variant.uses_cuda
            gpu_energy_j = hardware.gpu_energy_reader(device.index or 0) if cuda else None
            cpu_energy_j = hardware.cpu_energy_reader()

        def on_epoch(record: EpochRecord) -> None:
            progress.epoch_done(record)
            if track:
                self.hooks.on_epoch(record)

        def on_checkpoint(state: engine.TrainingState) -> None:
            with self.hooks.phase("checkpoint"):
                save_checkpoint(state)

        if seed is not None:
            recipe = job.recipe.model_copy(update={"seed": seed})
            self.model = build.fresh_model(job.dataset, recipe, variant, device)
        distributed = placement.backend is not None
        spec = engine.FitSpec(job.recipe, variant, device, accumulation_steps, distributed)
        # one profile per attempt: an OOM retry starts counting steps again
        with profiling.step_profiler(
            job.out.profile if track else None,
            job.name,
            placement.rank,
            len(self.batches),
            cuda=cuda,
        ) as profile_step:

            def on_step(samples: int) -> None:
                progress.step(samples)
                profile_step()

            hooks = engine.FitHooks(
                on_step=on_step,
                on_epoch=on_epoch,
                on_checkpoint=on_checkpoint if save_checkpoint is not None else None,
                gpu_energy_j=gpu_energy_j,
                cpu_energy_j=cpu_energy_j,
                stopped_s=self.heartbeat.stopped_s,
                phase=self.hooks.phase,
            )
            return engine.fit(self.model, self.batches, self.test_batches, spec, hooks, resume_from)
