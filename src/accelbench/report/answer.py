"""The answer the report leads with: each variant's speed figures with their 95% intervals,
and the headline sentences that say who is fastest, by how much, and how sure that is.

Pure: typed results in, figures and text out (`spread` draws the intervals).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from accelbench.core import spread
from accelbench.core.params import VariantParams
from accelbench.core.progress import fmt_interval, fmt_ratio, fmt_seconds
from accelbench.core.results import (
    EnvFacts,
    EpochRecord,
    EvalResult,
    EvalSummary,
    QuantizedResult,
    Skipped,
    TrainResult,
    TrainSummary,
    steady_epochs,
)
from accelbench.core.spread import Figure


@dataclass
class Row:
    """One variant as the compare stage read it: params, training, evaluation, epochs."""

    name: str
    variant: VariantParams
    train: TrainResult
    eval: EvalResult | None = None
    epochs: list[EpochRecord] = field(default_factory=list)
    quantized: QuantizedResult | None = None
    stage_s: float | None = None  # its train stage's wall time, process start to its end

    @property
    def trained(self) -> bool:
        return isinstance(self.train, TrainSummary)

    @property
    def test_accuracy(self) -> float:
        """The evaluate stage's figure, else the last epoch's (both on the test set)."""
        if isinstance(self.eval, EvalSummary):
            return self.eval.test_accuracy
        return self.train.final_test_accuracy

    @property
    def steady_samples(self) -> list[float]:
        """Every steady epoch's seconds: train.json's (the repeats' too), else epochs.csv's."""
        if not isinstance(self.train, TrainSummary):
            return []
        if self.train.steady_epochs_s is not None:
            return list(self.train.steady_epochs_s)
        if self.epochs:
            return [e.train_time_s for e in steady_epochs(self.epochs)]
        steady = self.train.steady_epoch_s  # a file with the median alone: one sample
        return [steady] if steady else []


SHARED_MARK = "(machine shared)"  # beside a variant measured while other work ran there


def shared_machine(row: Row) -> str | None:
    """What else ran on the host while `row` trained or was evaluated (train.json's and
    eval.json's `shared_machine`), if anything."""
    training = row.train.shared_machine if isinstance(row.train, TrainSummary) else None
    inference = row.eval.shared_machine if isinstance(row.eval, EvalSummary) else None
    if not inference:
        return training  # as train.json says it
    return "; ".join(
        f"{what}: {note}"
        for what, note in (("training", training), ("inference", inference))
        if note
    )


def shared_notes(rows: list[Row]) -> list[str]:
    """The variants measured while other work shared the machine, and what it was, and the
    epochs their process was stopped in (left out of the steady figures): a list, or nothing
    where every variant had the machine to itself."""
    shared = [(row.name, note) for row in rows if (note := shared_machine(row))]
    stopped = [
        f"- {row.name} epoch {e.epoch} was stopped for {fmt_seconds(e.stopped_s)} (SIGSTOP, "
        "a suspend or no CPU): left out of the steady figures."
        for row in rows
        for e in row.epochs
        if e.stopped
    ]
    if not shared:
        return stopped
    return [
        f"{SHARED_MARK}: measured while other work ran on the machine, so its times may be "
        "slower than the machine alone gives:",
        *(f"- {name}: {note}." for name, note in shared),
        *stopped,
    ]


def time_to_target(epochs: list[EpochRecord], target: float) -> tuple[float, int] | None:
    """Training seconds until the first epoch whose test accuracy reached `target`, and that
    epoch; None if none did."""
    elapsed = 0.0
    for epoch in epochs:
        elapsed += epoch.train_time_s
        if epoch.test_accuracy >= target:
            return elapsed, epoch.epoch
    return None


@dataclass(frozen=True)
class VariantFigures:
    """A trained variant's speed figures, each with its interval where one can be drawn."""

    steady_epoch: Figure
    samples_per_s: Figure
    speedup: Figure | None  # over the report's baseline (1, no interval: the baseline itself)
    fp32_twin: str | None  # the fp32 variant with otherwise identical settings
    over_fp32: Figure | None  # mixed precision's speedup over `fp32_twin`
    to_target: Figure | None  # training time to the target accuracy, first epoch included
    target_epoch: int | None
    uncompiled_twin: str | None = None  # the same settings without compile (and autotuning)
    break_even: BreakEven | None = None  # when compiling paid for itself against that twin
    seeds: Seeds | None = None  # the run and its repeats, one seed each (two or more)

    def compared(self, baseline: str | None) -> dict[str, float | None]:
        """The figures a user compares across variants (DVC's metrics): the steady epoch and
        every speedup with their `_lo`/`_hi` ends, the time to target without."""
        out = self.steady_epoch.fields("steady_epoch_s")
        if self.speedup is not None:
            out |= self.speedup.fields(f"speedup_vs_{baseline}")
        if self.over_fp32 is not None:
            out |= self.over_fp32.fields("speedup_vs_fp32")
        if self.to_target is not None:
            out["time_to_target_s"] = self.to_target.value
        return out

    def metrics(self, baseline: str | None) -> dict[str, float | None]:
        """Every figure with its `_lo`/`_hi` ends: comparison.json, MLflow."""
        out = self.compared(baseline) | self.samples_per_s.fields("steady_samples_per_s")
        if self.to_target is not None:
            out |= self.to_target.fields("time_to_target_s")
        if self.break_even is not None:
            out["break_even_epochs"] = self.break_even.epochs  # None: never
        if self.seeds is not None:
            out |= self.seeds.metrics()
        return out


@dataclass(frozen=True)
class Seeds:
    """Time to target and final accuracy over the run's seed and its repeats' (one each):
    each seed's epochs after its first, after the run's first epoch as measured (a seed
    changes which epoch reaches the target, not what the first epoch pays: compiling, a
    cold start); the range over the seeds that reached the target."""

    count: int
    to_target_s: list[float]  # the seeds that reached it
    final_accuracy: list[float]  # every seed's

    def metrics(self) -> dict[str, float | int]:
        out = {"seeds": self.count, "seeds_reached": len(self.to_target_s)}
        ranges = {
            "time_to_target_seeds": self.to_target_s,
            "final_accuracy_seeds": self.final_accuracy,
        }
        return out | {f"{k}_{f.__name__}": f(v) for k, v in ranges.items() if v for f in (min, max)}

    def text(self) -> str:
        """ "3/3 seeds: 1.25–1.31 s, final 99.23–99.31%"."""
        reached = self.to_target_s
        lo, hi = (fmt_seconds(f(reached)) if reached else "" for f in (min, max))
        times = f": {lo.removesuffix(' s')}–{hi}" if reached else ""
        low, high = min(self.final_accuracy), max(self.final_accuracy)
        return f"{len(reached)}/{self.count} seeds{times}, final {low:.2%}–{high:.2%}"


def seeds(row: Row, target: float) -> Seeds | None:
    """`row`'s spread over seeds, where it trained repeats (None: one seed)."""
    train = row.train
    if not isinstance(train, TrainSummary) or not train.repeat_epochs or not row.epochs:
        return None
    runs = [[(e.train_time_s, e.test_accuracy) for e in row.epochs], *train.repeat_epochs]
    reached = []
    for run in runs:
        seconds = [row.epochs[0].train_time_s] + [s for s, _ in run[1:]]  # the run's first
        hit = next((n for n, (_, accuracy) in enumerate(run) if accuracy >= target), None)
        if hit is not None:
            reached.append(sum(seconds[: hit + 1]))
    return Seeds(len(runs), reached, [run[-1][1] for run in runs])


@dataclass(frozen=True)
class BreakEven:
    """After how many epochs a compiled variant's training has taken no longer than its
    uncompiled twin's: within the run where its epochs show it (`observed`), else from the
    two runs' measured first and steady epochs; None: never (no faster steady epoch)."""

    epochs: int | None
    observed: bool
    first_s: float  # the compiled variant's first epoch (compiling), and the twin's
    twin_first_s: float
    saved_s: float  # steady seconds an epoch the compiled variant saves (<= 0: none)


def break_even(compiled: list[EpochRecord], twin: list[EpochRecord], saved_s: float) -> BreakEven:
    """`compiled`'s break-even against `twin`, each a run's epochs (one process each: the
    first epoch pays the compiling), `saved_s` the difference of their steady medians."""
    first, twin_first = compiled[0].train_time_s, twin[0].train_time_s
    spent = twin_spent = 0.0
    for n, (mine, theirs) in enumerate(zip(compiled, twin, strict=False), start=1):
        spent, twin_spent = spent + mine.train_time_s, twin_spent + theirs.train_time_s
        if spent <= twin_spent:
            return BreakEven(n, True, first, twin_first, saved_s)
    extra = first - twin_first  # the compiling's cost, which the steady epochs pay back
    epochs = 1 + math.ceil(extra / saved_s) if saved_s > 0 else None
    return BreakEven(epochs, False, first, twin_first, saved_s)


def _twins(
    rows: list[Row], differing: set[str], base: Callable[[VariantParams], bool]
) -> dict[str, str]:
    """Each variant that is not a `base` one -> the first `base` variant whose settings
    differ from its own only in `differing`."""
    bases = [r for r in rows if base(r.variant)]
    twins = {}
    for row in rows:
        ours = row.variant.model_dump(exclude=differing)
        same = (b.name for b in bases if b.variant.model_dump(exclude=differing) == ours)
        if not base(row.variant) and (twin := next(same, None)):
            twins[row.name] = twin
    return twins


def fp32_twins(rows: list[Row]) -> dict[str, str]:
    """Each mixed-precision variant -> the fp32 variant whose settings are otherwise the
    same (amp -> gpu in params.yaml): their ratio is what mixed precision alone buys."""
    return _twins(rows, {"precision"}, lambda v: v.precision == "fp32")


def uncompiled_twins(rows: list[Row]) -> dict[str, str]:
    """Each compiled variant -> the uncompiled one whose settings are otherwise the same,
    compile and cudnn.benchmark apart (both set-up spent for a faster steady epoch): amp ->
    amp_uncompiled in params.yaml."""
    return _twins(rows, {"compile", "cudnn_benchmark"}, lambda v: v.compile == "none")


def variant_figures(
    rows: list[Row], baseline: str | None, target: float
) -> dict[str, VariantFigures]:
    """The figures of every trained variant with a steady epoch (two epochs or more)."""
    samples = {r.name: r.steady_samples for r in rows if r.trained and r.steady_samples}
    by_name = {r.name: r for r in rows}
    twins = fp32_twins(rows)
    uncompiled = {n: t for n, t in uncompiled_twins(rows).items() if t in samples}
    out = {}
    for row in rows:
        if row.name not in samples:
            continue
        mine = samples[row.name]
        steady = spread.median(mine)
        base = samples.get(baseline)
        twin = twins.get(row.name) if twins.get(row.name) in samples else None
        reached = time_to_target(row.epochs, target)
        to_target = None
        if reached:
            # warm-up epochs (the first, a resume's first) stay as measured, less any time
            # stopped, as do stopped ones; the steady epochs are redrawn
            epochs = row.epochs[: reached[1]]
            settled = steady_epochs(epochs)
            fixed = [e.train_time_s - e.stopped_s for e in epochs if e not in settled]
            to_target = spread.total_after(sum(fixed), [e.train_time_s for e in settled])
        out[row.name] = VariantFigures(
            steady_epoch=steady,
            samples_per_s=steady.inverse(row.train.train_samples),
            speedup=(Figure(1.0) if row.name == baseline else spread.ratio_of_medians(base, mine))
            if base
            else None,
            fp32_twin=twin,
            over_fp32=spread.ratio_of_medians(samples[twin], mine) if twin else None,
            to_target=to_target,
            target_epoch=reached[1] if reached else None,
            seeds=seeds(row, target),
        )
    for name, twin in uncompiled.items():
        if name in out:
            saved = out[twin].steady_epoch.value - out[name].steady_epoch.value
            even = break_even(by_name[name].epochs, by_name[twin].epochs, saved)
            out[name] = replace(out[name], uncompiled_twin=twin, break_even=even)
    return out


def _fmt_figure(figure: Figure | None, fmt: Callable[[float], str]) -> str:
    if figure is None:
        return "n/a"
    return fmt_interval(figure.value, figure.lo, figure.hi, fmt)


def fmt_speedup(figure: Figure | None) -> str:
    """A speedup with its interval: 12.3× (11.0–13.5×); "n/a" for None."""
    return _fmt_figure(figure, fmt_ratio)


def fmt_time(figure: Figure | None) -> str:
    """A duration with its interval: 0.129 s (0.127–0.131 s); "n/a" for None."""
    return _fmt_figure(figure, fmt_seconds)


def _precision_threads(variant: VariantParams) -> str:
    if variant.device == "cpu" and variant.threads:
        return f"{variant.precision}, {variant.threads} threads"
    return variant.precision


def headline(
    rows: list[Row],
    figures: Mapping[str, VariantFigures],
    env: EnvFacts,
    baseline: str | None,
    target: float,
) -> list[str]:
    """Two to four sentences: who is fastest and by how much, what mixed precision alone
    buys, who reaches the target first, and what was skipped."""
    cpu, gpu = env.cpu, env.cuda.gpu
    machine = f"{cpu.cpu_model} ({cpu.torch_default_threads} threads)"
    if gpu is not None:
        machine = f"{gpu.gpu_names[0]} and {machine}"
    stack = f"torch {cpu.software.torch}"
    skipped = [r.name for r in rows if not r.trained]
    if not figures:
        return [f"On {machine}, {stack}: no variant has a steady epoch (none trained two "
                "epochs or more, past a resume's warm-up), so there is nothing to compare" + (f" (skipped: {', '.join(skipped)})." if skipped else ".")]  # fmt: skip
    by_name = {r.name: r for r in rows}
    fastest = min(figures, key=lambda n: figures[n].steady_epoch.value)
    best = figures[fastest]
    sentence = (
        f"On {machine}, {stack}: **{fastest}** ({by_name[fastest].variant.device}, "
        f"{_precision_threads(by_name[fastest].variant)}) "
        + ("trains fastest, " if len(figures) > 1 else "is the only variant trained here, ")
        + f"{fmt_time(best.steady_epoch)} a steady epoch"
    )
    if best.speedup is not None and fastest != baseline:
        sentence += f", **{fmt_speedup(best.speedup)}** faster than {baseline}"
    others = [
        f"{name} {fmt_speedup(f.speedup)}"
        for name, f in figures.items()
        if name not in (fastest, baseline) and f.speedup is not None
    ]
    sentences = [sentence + (f" (others: {'; '.join(others)})." if others else ".")]
    if baseline is not None and baseline not in figures:  # every speedup column reads n/a
        base = by_name.get(baseline)
        why = (
            f"was skipped on this machine ({base.train.reason})"
            if base is not None and isinstance(base.train, Skipped)
            else "has no steady epoch (one epoch trained, or each a warm-up)"
        )
        sentences.append(
            f"No speedups: their baseline, {baseline}, {why}; report.speedup_baseline in "
            "params.yaml names it."
        )
    for name, f in figures.items():
        if f.over_fp32 is not None:
            sentences.append(
                f"Mixed precision alone ({name}'s {by_name[name].variant.precision} over "
                f"{f.fp32_twin}'s fp32, every other setting the same) is "
                f"**{fmt_speedup(f.over_fp32)}** faster."
            )
    reached = {n: f for n, f in figures.items() if f.to_target is not None}
    if reached:
        first = min(reached, key=lambda n: reached[n].to_target.value)
        missed = [n for n in figures if n not in reached]
        stage = by_name[first].stage_s
        sentences.append(
            f"To {target:.1%} test accuracy"
            + (f", end to end, **{first}** is first" if len(figures) > 1 else f", {first} took")
            + f": {fmt_time(reached[first].to_target)} of training (epoch "
            f"{reached[first].target_epoch}, its first epoch's {first_epoch_cost(by_name[first])}"
            " included"
            + (f"; its train stage {fmt_seconds(stage)} from process start" if stage else "")
            + (f"; {reached[first].seeds.text()})" if reached[first].seeds else ")")
            + (f"; {', '.join(missed)} never reached it." if missed else ".")
        )
    else:
        sentences.append(f"No variant reached {target:.1%} test accuracy.")
    if pays := compiling_pays(figures):
        sentences.append(pays)
    low, high = (f(by_name[n].test_accuracy for n in figures) for f in (min, max))
    accuracy = f"{low:.2%}–{high:.2%}" if f"{low:.2%}" != f"{high:.2%}" else f"{low:.2%}"
    sentences.append(
        f"Test accuracy {accuracy}"
        + (" across the trained variants" if len(figures) > 1 else "")
        + (f"; skipped on this machine: {', '.join(skipped)}." if skipped else ".")
    )
    return sentences


def first_epoch_cost(row: Row) -> str:
    """What a variant's first epoch paid for: warm-up, and compiling with its cache's state."""
    state = row.train.compile_cache if isinstance(row.train, TrainSummary) else None
    if row.variant.compile == "none":
        return "warm-up"
    return f"warm-up and compiling ({state} compile cache)" if state else "warm-up and compiling"


def compiling_pays(figures: Mapping[str, VariantFigures]) -> str | None:
    """One sentence: after how many epochs each compiled variant's compiling paid for itself
    against its uncompiled twin, from what it measured; None without such a pair."""
    parts = []
    for name, f in figures.items():
        even = f.break_even
        if even is None:
            continue
        cost = f"{name} ({fmt_seconds(even.first_s)} first epoch against {f.uncompiled_twin}'s {fmt_seconds(even.twin_first_s)}"
        if even.epochs is None:
            parts.append(f"{cost}, no faster a steady epoch): never")
        else:
            how = (
                "as measured"
                if even.observed
                else f"{fmt_seconds(even.saved_s)} saved each steady epoch"
            )
            parts.append(f"{cost}, {how}): after {even.epochs} epoch{'s' * (even.epochs != 1)}")
    if not parts:
        return None
    return (
        "Compiling pays for itself, against the same settings uncompiled, for "
        + "; ".join(parts)
        + "."
    )
