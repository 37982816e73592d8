"""Time candidate ways of running the training step on one GPU, each in a fresh process with
its own cold torch.compile cache, and print one JSON line per candidate.

    python benchmarks/step_options.py amp:base amp:poolfirst gpu:base ... [--epochs 4] [--profile DIR]

A candidate is VARIANT:OPTION[+OPTION...] over params.yaml's variant:
  base      the step as the pipeline runs it
  cdt       Inductor's coordinate-descent tuning of its generated kernels
  limit0    cuDNN's benchmark tries every engine (torch.backends.cudnn.benchmark_limit = 0)
  limit2    cuDNN's benchmark tries its heuristics' first two engines only (default: ten)
  poolfirst max-pool before the second ReLU (the same function: max and ReLU commute)
  autotune  torch.compile mode max-autotune-no-cudagraphs (Triton and cuDNN convolutions)
  eagershift the augmentation outside the compiled loss (written once, as before 1b1bc46)
  taps      conv1 under torch.compile as its nine shifted multiply-adds (as shipped until
            2026-12-05), not one GEMM of its 3x3 patches and weights
  threads1  Inductor compiles in this process, no pool of compile workers
  nobench   cudnn.benchmark off: cuDNN's heuristics pick, no engines tried (nor JIT-built)
  warmpool  Inductor's pool of compile workers started right after torch's import, instead
            of when torch.compile first calls Inductor (timed on 2026-12-03 and not adopted
            by the train stage: docs/results/2026-12-03-h200-tracking-worker.md)
  onecfg    one Triton launch config per generated kernel (Inductor's
            triton.autotune_pointwise off): fewer kernels for Triton to compile, none tried
  aggfuse   Inductor's aggressive_fusion: kernels fused across more of the graph (fewer)
  nopattern Inductor's pattern-matcher passes off (part of its graph passes' time)
  mmgrad    conv1 under torch.compile as its taps forward, its weight gradient one GEMM of
            the output gradient and the 3x3 patches (as the shipped GEMM's)
  fork      Inductor's compile workers forked from this process (worker_start_method), not
            started as subprocesses that each import torch
  threads4, threads8  Inductor's pool of compile workers 4 or 8 wide (default: one a core)
  combo     Inductor's combo kernels: independent kernels horizontally fused (fewer)
  nopersist Triton persistent reductions off (each reduction one loop kernel)
  forcelayout Inductor's layout optimization forced on: every convolution's input, output and
            gradients channels-last in the compiled graph (its heuristic leaves it off when
            all convolutions have at most 64 channels, as this CNN's conv2)
  bench     cudnn.benchmark on: cuDNN times its engines of each convolution, keeps the fastest
  pwtune    Inductor tunes each generated pointwise kernel's launch config (kernel_autotune)
Each candidate starts with its own empty Inductor and CUDA JIT caches, as a train stage on a
fresh machine does, and reports where its compiling went (Dynamo's compile_times).
Reads --params (params.yaml) and --data (data/prepared: `dvc repro prepare`). Nothing is
written to MLflow or DVC. The first epoch includes compilation and graph capture; steady is
the median of the others, as in the report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accelbench.core.console import script_main

OPTIONS = (
    "base",
    "cdt",
    "limit0",
    "limit2",
    "poolfirst",
    "autotune",
    "eagershift",
    "taps",
    "threads1",
    "nobench",
    "warmpool",
    "onecfg",
    "aggfuse",
    "nopattern",
    "mmgrad",
    "fork",
    "threads4",
    "threads8",
    "combo",
    "nopersist",
    "forcelayout",
    "bench",
    "pwtune",
)


# Options that change a variant's own params, as params.yaml could.
VARIANT_UPDATES = {
    "nobench": {"cudnn_benchmark": False},
    "bench": {"cudnn_benchmark": True},
    "pwtune": {"kernel_autotune": True},
    "autotune": {"compile": "max-autotune-no-cudagraphs"},
}


CUDNN_OPTIONS = {"bench", "nobench", "limit0", "limit2"}
NOT_INDUCTOR = CUDNN_OPTIONS | {"base", "poolfirst", "autotune"}  # the rest act under compile


def _updated(variant, options: set[str]):
    """The variant as the candidate's VARIANT_UPDATES options leave it."""
    for option in sorted(options & VARIANT_UPDATES.keys()):
        variant = variant.model_copy(update=VARIANT_UPDATES[option])
    return variant


def _patch(options: set[str], variant):
    """Apply the candidate's options; returns the variant to train."""
    import torch
    from torch import nn

    from accelbench.training import engine, models, step

    if "cdt" in options:
        torch._inductor.config.coordinate_descent_tuning = True
    if "onecfg" in options:
        torch._inductor.config.triton.autotune_pointwise = False
    if "nopattern" in options:
        torch._inductor.config.pattern_matcher = False
    if "aggfuse" in options:
        torch._inductor.config.aggressive_fusion = True
    for threads in (1, 4, 8):
        if f"threads{threads}" in options:
            torch._inductor.config.compile_threads = threads
    if "fork" in options:
        torch._inductor.config.worker_start_method = "fork"
    if "combo" in options:
        torch._inductor.config.combo_kernels = True
    if "nopersist" in options:
        torch._inductor.config.triton.persistent_reductions = False
    if "forcelayout" in options:
        torch._inductor.config.force_layout_optimization = True
    variant = _updated(variant, options)
    if "poolfirst" in options:
        original_init = models.SeedCNN.__init__

        def init(self, dropout: float = 0.25) -> None:
            original_init(self, dropout)
            conv1, relu1, conv2, relu2, pool, drop = self.features
            self.features = nn.Sequential(conv1, relu1, conv2, pool, relu2, drop)

        models.SeedCNN.__init__ = init
    limits = [int(o.removeprefix("limit")) for o in options if o.startswith("limit")]
    if limits:
        configure = engine.configure_backends

        def configure_all(variant, deterministic=False):
            configure(variant, deterministic)
            torch.backends.cudnn.benchmark_limit = limits[0]

        engine.configure_backends = configure_all
    if "eagershift" in options:
        step.TrainStep.augment = torch.compiler.disable(step.TrainStep.augment)
    if "taps" in options:
        models.conv2d_one_channel = conv2d_taps
    if "mmgrad" in options:
        models.conv2d_one_channel = conv2d_taps_mm_grad
    return variant


def conv2d_taps(x, weight, bias):
    """conv2d of one input channel as its k*k shifted multiply-adds: Inductor generates one
    kernel for the forward and a reduction for the weight gradient."""
    from accelbench.training.models import one_channel_taps

    taps, bias = one_channel_taps(x, weight, bias)
    out = bias.view(1, -1, 1, 1)
    for shifted, tap in taps:
        out = out + shifted * tap.view(1, -1, 1, 1)
    return out


def conv2d_taps_mm_grad(x, weight, bias):
    """conv2d of one input channel: the shipped taps forward, the weight gradient as a GEMM."""
    import torch

    from accelbench.training import models

    class TapsMmGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return conv2d_taps(x, weight, bias)

        @staticmethod
        def backward(ctx, grad_out):
            x, weight = ctx.saved_tensors
            taps, _ = models.one_channel_taps(x, weight, weight.new_zeros(weight.shape[0]))
            patches = torch.stack([shifted[:, 0] for shifted, _ in taps], dim=-1)  # [N,H,W,9]
            patches = patches.to(grad_out.dtype)  # the backward runs outside autocast
            go = grad_out.permute(0, 2, 3, 1).reshape(-1, grad_out.shape[1])
            grad_w = go.t() @ patches.reshape(-1, patches.shape[-1])  # [C, 9]
            grad_b = grad_out.sum(dim=(0, 2, 3))
            return None, grad_w.view_as(weight).to(weight.dtype), grad_b.to(weight.dtype)

    return TapsMmGrad.apply(x, weight, bias)


def _kernel_count() -> int | None:
    from torch._inductor import metrics

    return getattr(metrics, "generated_kernel_count", None)


def parse_candidate(candidate: str, variants: dict) -> tuple[str, set[str]]:
    """'amp:poolfirst+cdt' -> ('amp', {'poolfirst', 'cdt'}); a ValueError names what is wrong."""
    name, _, spec = candidate.partition(":")
    if name not in variants:
        raise ValueError(f"{candidate!r}: no variant {name!r} (params: {', '.join(variants)})")
    if variants[name].distributed is not None:
        raise ValueError(f"{candidate!r}: a DDP variant (time it with benchmarks/scaling.py)")
    options = set(spec.split("+")) - {""}
    unknown = options - set(OPTIONS)
    if unknown:
        raise ValueError(f"{candidate!r}: unknown {sorted(unknown)}; known: {', '.join(OPTIONS)}")
    for one, other in (("bench", "nobench"), ("limit0", "limit2")):
        if {one, other} <= options:
            raise ValueError(f"{candidate!r}: {one} and {other} contradict each other; name one")
    variant = _updated(variants[name], options)
    for option in sorted(options & VARIANT_UPDATES.keys()):
        if _updated(variants[name], options - {option}) == variant:
            raise ValueError(
                f"{candidate!r}: {name} already has {VARIANT_UPDATES[option]}, so {option} "
                "changes nothing; drop it"
            )
    cudnn = sorted(o for o in options if o in CUDNN_OPTIONS)
    if cudnn and variant.device != "cuda":
        raise ValueError(
            f"{candidate!r}: {cudnn} set cuDNN, which a {variant.device} variant skips"
        )
    inductor = sorted(options - NOT_INDUCTOR)
    if inductor and variant.compile == "none":
        raise ValueError(f"{candidate!r}: {inductor} change torch.compile, which {name} skips")
    if "pwtune" in options and variant.compile != "default":
        raise ValueError(
            f"{candidate!r}: pwtune tunes compile: default only, not {variant.compile}"
        )
    limits = [o for o in cudnn if o.startswith("limit")]
    if limits and not variant.cudnn_benchmark:
        fix = "drop nobench" if "nobench" in options else "add bench"
        raise ValueError(f"{candidate!r}: {limits[0]} needs cuDNN's benchmark; {fix}")
    return name, options - {"base"}


def run_one(candidate: str, args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    import torch

    if "warmpool" in candidate.partition(":")[2].split("+"):
        from torch._inductor.async_compile import maybe_warm_pool

        maybe_warm_pool()
    import variants  # benchmarks/variants.py: built and trained as there

    from accelbench.core.params import load_params
    from accelbench.training import engine, placement, profiling

    imported = time.perf_counter() - started
    params = load_params(args.params)
    name, options = parse_candidate(candidate, params.variants)
    recipe = params.train.model_copy(update={"epochs": args.epochs})
    if args.subset is not None:
        recipe = recipe.model_copy(update={"train_subset": args.subset})
    variant = _patch(options, params.variant(name))
    where = placement.place(name, variant, require_gpu=recipe.require_gpu)
    if where.skip_reason is not None:
        return {"candidate": candidate, "skipped": where.skip_reason}
    built = variants.build_as_pipeline(where.device, variant, recipe, args.data)
    label = candidate.replace(":", "-").replace("+", "-")
    on_gpu = built.device.type == "cuda"
    steps = len(built.train_batches)
    with profiling.step_profiler(args.profile, label, 0, steps, cuda=on_gpu) as on_step:
        records = variants.fit_as_pipeline(built, variant, recipe, lambda n: on_step())
    times = [r.train_time_s for r in records]
    steady = engine.summarize(records).steady_epoch_s
    compiled = (
        torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
        if variant.compile != "none"
        else ([], [])
    )
    return {
        "candidate": candidate,
        "device": where.device_name,
        "torch": torch.__version__,
        "import_s": round(imported, 2),
        "first_epoch_s": round(times[0], 3),
        "steady_epoch_s": round(steady, 4) if steady else None,
        "epoch_s": [round(t, 4) for t in times],
        "test_accuracy": [round(r.test_accuracy, 4) for r in records],
        "train_loss": [round(r.train_loss, 4) for r in records],
        "wall_s": round(time.perf_counter() - started, 1),
        "compile_times_s": {
            name: round(float(seconds), 2)
            for name, seconds in zip(*compiled, strict=False)
            if float(seconds) >= 0.3
        },
        "graphs": dict(torch._dynamo.utils.counters["stats"]),
        # What Triton compiled: one cubin per kernel and launch config, in this candidate's
        # own (emptied) cache.
        "cubins": sum(
            1
            for _ in Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/nonexistent")).rglob(
                "*.cubin"
            )
        ),
        "kernels": _kernel_count(),
        "profiled": args.profile is not None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="+", metavar="VARIANT:OPTIONS")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--data", type=Path, default=Path("data/prepared"))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--subset", type=int, help="first N training images (0: all)")
    parser.add_argument("--profile", type=Path, help="also write a step profile of each here")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.candidates[0], args)), flush=True)
        return 0
    from accelbench.core.params import load_params

    variants = load_params(args.params).variants
    for candidate in args.candidates:  # every candidate checked before any is run
        try:
            parse_candidate(candidate, variants)
        except ValueError as exc:
            parser.error(str(exc))
    failed = 0
    for candidate in args.candidates:
        with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
            env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": cache, "CUDA_CACHE_PATH": f"{cache}/jit"}
            command = [sys.executable, __file__, "--one", candidate, "--epochs", str(args.epochs)]
            command += ["--params", str(args.params), "--data", str(args.data)]
            if args.subset is not None:
                command += ["--subset", str(args.subset)]
            if args.profile:
                command += ["--profile", str(args.profile)]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            failed += 1
            tail = done.stderr.strip().splitlines()[-5:]
            print(json.dumps({"candidate": candidate, "error": tail}), flush=True)
        else:
            print(done.stdout.strip().splitlines()[-1], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(script_main(main, "step_options.py"))
