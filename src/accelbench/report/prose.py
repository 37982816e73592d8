"""The wording of reports/comparison.md, as plain text blocks: `{name}` is a field that
markdown.py and answer.py fill with a figure already computed and formatted. A block written
over several lines here is one line in the report (a paragraph), unless it says otherwise.
`table` lays out every markdown table: the report's and `accelbench runs`'."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _paragraph(text: str) -> str:
    return " ".join(text.split())


def table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table's lines: its head, the rule under it, a line per row."""
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(map(str, cells)) + " |" for cells in rows),
    ]


TITLE = "# accelbench comparison"

# --- the headline (answer.py) -------------------------------------------------------------

NOTHING_TO_COMPARE = _paragraph("""On {machine}, {stack}: no variant has a steady epoch (none
trained two epochs or more, past a resume's warm-up), so there is nothing to compare{skipped}.""")
NOTHING_SKIPPED = " (skipped: {names})"
FASTEST = _paragraph("""On {machine}, {stack}: **{name}** ({device}, {precision}) {rank}, {steady} a
steady epoch{faster}{others}.""")
RANK_FIRST = "trains fastest"
RANK_ONLY = "is the only variant trained here"
FASTER_THAN = ", **{speedup}** faster than {baseline}"
OTHERS = " (others: {others})"
NO_SPEEDUPS = _paragraph("""No speedups: their baseline, {baseline}, {why}; report.speedup_baseline
in params.yaml names it.""")
BASELINE_SKIPPED = "was skipped on this machine ({reason})"
BASELINE_NO_STEADY = "has no steady epoch (one epoch trained, or each a warm-up)"
PRECISION_ALONE = _paragraph("""Mixed precision alone ({name}'s {precision} over {twin}'s fp32,
every other setting the same) is **{speedup}** faster.""")
TARGET_FIRST = ", end to end, **{name}** is first"
TARGET_ONLY = ", {name} took"
TO_TARGET = _paragraph("""To {target} test accuracy{who}: {time} of training (epoch {epoch}, its
first epoch's {cost} included{stage}{seeds}){missed}.""")
TARGET_STAGE = "; its train stage {stage} from process start to a saved model"
TARGET_SEEDS = "; {seeds}"
TARGET_MISSED = "; {names} never reached it"
NO_TARGET = "No variant reached {target} test accuracy."
FIRST_EPOCH_WARM_UP = "warm-up"
FIRST_EPOCH_COMPILING = "warm-up and compiling"
FIRST_EPOCH_CACHE = "warm-up and compiling ({state} compile cache)"
COMPILING_PAYS = "Compiling pays for itself, against the same settings uncompiled, for {pairs}."
PAYS_COST = "{name} ({first} first epoch against {twin}'s {twin_first}"
PAYS_NEVER = "{cost}, no faster a steady epoch): never"
PAYS_AFTER = "{cost}, {how}): after {epochs} epoch{plural}"
PAYS_MEASURED = "as measured"
PAYS_SAVED = "{saved} saved each steady epoch"
ACCURACY = "Test accuracy {accuracy}{across}{skipped}."
ACCURACY_ACROSS = " across the trained variants"
ACCURACY_SKIPPED = "; skipped on this machine: {names}"

# --- under the answer's table ---------------------------------------------------------------

ANSWER_NOTE = _paragraph("""Steady epoch: the median over {samples}; {method} To target, training:
training time up to the first epoch at the target, its interval redrawing the steady epochs from
themselves (the first, warm-up and any compiling, stays as measured, with its compile cache: cold,
warm or portable); *k/n seeds*: over the run and its `repeats`, each at the next seed, each seed's
epochs after the run's first (range over the seeds that reached it), and their final accuracy;
{one_seed}. Train stage, to a saved model: the stage's wall time from process start (imports, data,
MLflow, the training, the model saved and logged) less its `repeats`, which train more seeds only
for the spread, from this pipeline's timings (the pipeline-time table has each stage's whole time).
Cost: energy and machine time at `cost:`'s prices (details below).""")
SAMPLES_SAME = "{epochs} per variant, from {trainings}"
ONE_STEADY_EPOCH = "1 steady epoch"
STEADY_EPOCHS = "{n} steady epochs"
ONE_TRAINING = "one training"
TRAININGS = "{n} trainings (`train.repeats`)"
SAMPLES_VARY = "each variant's steady epochs (see the details table for how many)"
ONE_SEED = "one seed: {names}"
SEVERAL_SEEDS = "every variant trained several seeds"
SHARED_NOTE = _paragraph("""{mark}: measured while other work ran on the machine, so its times may
be slower than the machine alone gives:""")
SHARED_VARIANT = "- {name}: {note}."
STOPPED_EPOCH = _paragraph("""- {name} epoch {epoch} was stopped for {seconds} (SIGSTOP, a suspend
or no CPU): left out of the steady figures.""")
SKIPPED = "Skipped {names}: {reason}."
SKIPPED_CELL = "skipped"
ONE_EPOCH = "one epoch: no steady"
NO_STEADY_EPOCH = "no steady epoch (resumed or stopped)"
NOT_REACHED = "not reached"
# The page of the run whose figures the repository ships (reports/metrics), which the README's
# Result links to: where a machine without a GPU finds a GPU's figures (here and `make metrics`).
RUN_OF_RECORD = "docs/results/2026-12-06-h200-run-of-record.md"
H200_POINTER = _paragraph(f"""No GPU variant trained here: the README's *Result* has one H200's
figures ({RUN_OF_RECORD}).""")
SUMMARY_FIGURE = "![summary: epoch time and accuracy per variant]({path})"

# --- the details ------------------------------------------------------------------------------

# As written: wrapped lines in the report too.
DETAILS = """\
## Details

Same model, data order, seed and hyperparameters for every variant; only what the variant
names differs. Epoch times are training only (evaluation excluded), read from clocks after a
device synchronize; *steady* is the median of epochs 2..N (of every repeat), the first
epoch (warm-up, autotuning, compilation) is shown apart; a training resumed after a kill
warms up again, and that epoch is in no steady figure either. A compiled variant's first
epoch names where its compiled graphs came from: *cold* (compiled here), *warm* (this
machine's compile cache), *portable* (compile-cache/<variant>.bin, made on a machine
with the same torch, Triton and GPU), *partial* (some of each).
"""
CPU = _paragraph("""- CPU: {cpu.cpu_model}, {cpu.logical_cpus} logical CPUs (torch uses
{cpu.torch_default_threads} threads by default)""")
SOFTWARE = _paragraph("""- Software: Python {software.python}, torch {software.torch}, torchvision
{software.torchvision}""")
GPU = _paragraph("""- GPU: {gpu.gpu_count} × {gpu.gpu_names[0]} ({gpu.gpu_memory_gib} GiB, compute
capability {gpu.compute_capability}), NVIDIA driver {cuda.nvidia_driver}, CUDA runtime
{cuda.torch_cuda_runtime}, cuDNN {gpu.cudnn}""")
NO_GPU = "- GPU: none usable ({cuda.reason})"
DATASET = "- Dataset: {dataset}"
DATASET_TITLES = {
    "mnist": "MNIST, the tutorials' seed CNN",
    "cifar10": "CIFAR-10, the DDP/AMP tutorial's LeNet",
}
RECIPE = "- Recipe: {recipe}"

SCALING = "## Scaling (DistributedDataParallel)"
SCALING_NOTE = _paragraph("""Scaling efficiency = speedup / processes, at the same global batch
(each process takes batch / processes).""")
SCALING_MIXED = _paragraph("""{name} differs from {base} in {settings}: its speedup mixes those
settings' effect with the scaling.""")
NO_SCALING_BASELINE = "none (report.scaling_baselines)"

QUANTIZED = "## Quantized inference on the CPU"
QUANT_LABELS = {  # each of QUANT_METHODS, as the table names it
    "fp32": "fp32",
    "dynamic_int8": "dynamic int8 (Linear layers)",
    "static_int8": "static int8 (x86 backend)",
}
QUANT_UNSUPPORTED = "not supported: {why}"
QUANTIZED_NOTE = _paragraph("""Measured by the quantize stage on this machine's CPU ({q.threads}
threads), whatever device trained the weights; latency is the median of {q.latency_repeats}
single-image passes (the models taking turns, so a busy spell of a shared machine slows them alike),
throughput one pass over the test set.""")

COST = "## Cost of a run"
COST_NOTE = _paragraph("""Costs are per 1,000 runs (one run costs a fraction of a cent). Prices
(`cost:` in params.yaml): electricity ${kwh_usd:g}/kWh; an hour of a CPU system ${cpu_hour_usd:g},
of a GPU system ${gpu_hour_usd:g} per GPU; where no counter was read, a CPU system draws
{cpu_system_w:g} W and a GPU system {gpu_system_w:g} W per GPU. Measured energy covers only the
parts named (a GPU board's counter leaves out the host; RAPL, the CPU packages, leaves out memory,
disks and fans). Training time only: evaluation and start-up excluded.""")

# The figures dvc.yaml's `plots:` draw, every variant in each, are not drawn again here.
PLOTS_POINTER = _paragraph("""Every epoch's training time, test accuracy and training loss, each
variant's F1 per digit and confusion matrix: `make plots` (DVC's plots, dvc_plots/index.html).""")
FLOPS = _paragraph("""Training FLOPs per sample (forward + backward, counted by
`torch.utils.flop_counter`): {mflop:.1f} MFLOP.""")

# As written: wrapped lines in the report too.
PIPELINE_TIME = """\
## Where the pipeline's time goes

Each stage's wall time from its process's start to its end, the timed epochs in it
(every seed's; first epochs included: compilation, autotuning and graph capture), and the rest:
*overhead*, split into phases (seconds). Stages DVC found up to date are shown as last
run, in italics, and are not in the totals.
"""
PIPELINE_COLUMNS = "stage | wall | timed epochs | overhead | largest overhead phases (s)"
UP_TO_DATE = "*{stage} (up to date)*"
UNTIL_THIS_REPORT = " (until this report)"
PIPELINE_TOTAL = "| **all stages that ran** | **{wall}** | **{training}** | **{overhead}** | |"
PIPELINE_SPAN = _paragraph("""`dvc repro` from its first stage's start to this report: {span}; DVC's
own work between the stages (hashing, dvc.lock, starting each stage's process and waiting for it to
exit): {between}.""")
PIPELINE_PHASES = "Overhead by phase, over the stages that ran: {phases}."
PHASES = "Phases: {legend}."

# As written. Published figures of the tutorials this project grew from (seed CNN, batch 512).
TUTORIALS = """\
## The tutorials' published figures (MNIST; for reference, other hardware)

| source | hardware | epoch | test accuracy |
|---|---|---|---|
| tutorial A | CPU (unnamed) | 82.3 s | 97.85% |
| tutorial A | GTX 1080 Ti | 3.9 s | 98.00% |
| tutorial B | i7-12700K | 58.7 s | 98.20% |
| tutorial B | RTX 4090 | 5.2 s | 98.40% |
"""

# --- the tables' columns, as a table's first line reads ---------------------------------------

ANSWER_COLUMNS = _paragraph("""variant | device, precision | steady epoch (95% interval) | speedup
vs {baseline} | to {target}: training | train stage, to a saved model | test accuracy | cost per 1,000
runs""")
SPEEDUP_COLUMN = 3  # left out with one variant: nothing to compare
DETAILS_COLUMNS = _paragraph("""variant | status | device | precision | batches | epochs | first
epoch | steady epoch (median; samples) | total train | samples/s (steady) | speedup vs {baseline} |
data wait | TFLOP/s (share of peak) | peak host RSS | peak GPU mem | GPU energy / epoch | test
accuracy | time to {target}""")
NO_BASELINE = "a baseline (none set)"
SCALING_COLUMNS = "variant | processes | steady epoch | speedup | scaling efficiency | baseline"
QUANTIZED_COLUMNS = _paragraph("""variant | model | test accuracy | vs fp32 | latency, batch 1 |
speedup | samples/s, batch {batch} | speedup | size | vs fp32""")
COST_COLUMNS = _paragraph("""variant | energy of a run (training) | energy from | energy cost | time
cost | cost of 1,000 runs | of 1,000 runs to {target}""")
