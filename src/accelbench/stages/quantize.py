"""quantize@V: the trained model on the CPU in fp32, dynamic int8 (Linear layers) and static
int8 (x86 backend): test accuracy, batch-1 latency, throughput at the eval batch, file size.

It writes files only (compare logs them to MLflow), holding the CPU's turn on this host
(`slots.tenancy`) as a CPU training does."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.core import phases
from accelbench.core.console import log
from accelbench.core.outputs import MetricsFiles, claim, remove_leftovers, staged, write_json
from accelbench.core.params import Params
from accelbench.core.results import ModelFile, QuantizedResult, QuantizedSummary, Skipped
from accelbench.system import slots

if TYPE_CHECKING:
    import torch

    from accelbench.data.batches import ResidentBatches


@dataclass(frozen=True)
class QuantizeInputs:
    batch_size: int
    test_subset: int
    latency_repeats: int
    calibration_samples: int


def select(params: Params) -> QuantizeInputs:
    return QuantizeInputs(
        params.train.eval_batch_size,
        params.train.test_subset,
        params.quantize.latency_repeats,
        params.quantize.calibration_samples,
    )


def run(
    root: Path, inputs: QuantizeInputs, model_path: Path, prepared_dir: Path, files: MetricsFiles
) -> QuantizedResult:
    claim(files.quantized_json)  # before any work: a user's file is never replaced
    remove_leftovers(files.quantized_json)
    with phases.phase("model"):
        model_file = ModelFile.load(model_path)
    name = model_file.variant
    phases.RECORDER.stage = f"quantize@{name}"
    if not model_file.trained:  # at once: nothing to load
        skipped = Skipped(model_file.reason or "no reason recorded")
        with staged() as outputs:
            write_json(outputs(files.quantized_json), skipped.to_json())
        log(f"quantize {name}: {model_file.status}")
        return skipped
    with phases.phase("imports"):  # torch and the int8 stack: only for a trained model
        import torch

        from accelbench.evaluation import quantization
    with slots.tenancy(name, stage="quantize", cpu=True) as tenancy:  # whatever it trained on
        with phases.phase("model"):  # the fp32 model, calibration data and the int8 models
            models, unsupported, test = _models(name, model_file, model_path, prepared_dir, inputs)
        with phases.phase("evaluation"):
            figures = quantization.measure(
                models, lambda: test.epoch(0), test.images[:1], inputs.latency_repeats
            )
        tenancy.shared()  # quantized.json has no place for it (yet): the log says it
    summary = QuantizedSummary(
        threads=torch.get_num_threads(),
        batch_size=inputs.batch_size,
        latency_repeats=inputs.latency_repeats,
        methods=figures,
        unsupported=unsupported,
    )
    with phases.phase("outputs"), staged() as outputs:
        write_json(outputs(files.quantized_json), summary.to_json())
    for method, f in figures.items():
        log(
            f"quantize {name}: {method}: accuracy {f.test_accuracy:.2%}, "
            f"batch-1 latency {f.latency_ms:.3f} ms, "
            f"{f.samples_per_s:,.0f} samples/s, {f.size_bytes / 1024:,.0f} KiB"
        )
    return summary


def _models(
    name: str, model_file: ModelFile, model_path: Path, prepared_dir: Path, inputs: QuantizeInputs
) -> tuple[dict[str, torch.nn.Module], dict[str, str], ResidentBatches]:
    """The fp32 model on the CPU, its int8 versions (those this build supports; why not, for
    the others) and the test batches."""
    import torch

    from accelbench.data import prepared
    from accelbench.data.batches import normalize_images
    from accelbench.evaluation import quantization
    from accelbench.training import build

    cpu = torch.device("cpu")
    dataset = prepared.prepared_dataset(prepared_dir)
    model = build.trained_model(dataset, model_file.state_dict, str(model_path))
    test = build.eval_batches(dataset, prepared_dir, cpu, inputs.batch_size, inputs.test_subset)
    calibration = normalize_images(
        prepared.load_split(prepared_dir, "train", inputs.calibration_samples).images, dataset, cpu
    ).split(inputs.batch_size)
    models = {"fp32": model, "dynamic_int8": quantization.dynamic_int8(model)}
    unsupported = {}
    reason = quantization.static_int8_unsupported()
    if reason is None:
        models["static_int8"] = quantization.static_int8(model, list(calibration))
    else:
        unsupported["static_int8"] = reason
        log(f"quantize {name}: static int8 not supported: {reason}")
    return models, unsupported, test


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True, help="the trained model file")
    parser.add_argument("--data", type=Path, required=True, help="prepared data folder")
    parser.add_argument("--metrics", type=Path, required=True, help="folder for metrics files")


def main(args: argparse.Namespace, params: Params, root: Path) -> None:
    run(root, select(params), args.model, args.data, MetricsFiles(args.metrics))
