"""The answer the report leads with: each variant's speed figures with their 95% intervals
(`spread` draws them), and the headline: who is fastest, by how much, how sure. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from accelbench.core import spread
from accelbench.core.env_facts import EnvFacts
from accelbench.core.params import VariantParams
from accelbench.core.progress import fmt_interval, fmt_ratio, fmt_seconds
from accelbench.core.results import (
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
from accelbench.report import prose


@dataclass
class Row:
    """One variant as the compare stage read it: params, training, evaluation, epochs."""

    name: str
    variant: VariantParams
    train: TrainResult
    eval: EvalResult | None = None
    epochs: list[EpochRecord] = field(default_factory=list)
    quantized: QuantizedResult | None = None
    stage_to_model_s: float | None = None  # its train stage, process start to its saved model

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
    notes = (("training", training), ("inference", inference))
    return "; ".join(f"{what}: {note}" for what, note in notes if note)


def shared_notes(rows: list[Row]) -> list[str]:
    """The notes on variants measured while other work shared the machine (what it was), and
    on epochs whose process was stopped (left out of the steady figures)."""
    shared = [(row.name, note) for row in rows if (note := shared_machine(row))]
    stopped = [
        prose.STOPPED_EPOCH.format(name=row.name, epoch=e.epoch, seconds=fmt_seconds(e.stopped_s))
        for row in rows
        for e in row.epochs
        if e.stopped
    ]
    if not shared:
        return stopped
    return [
        prose.SHARED_NOTE.format(mark=SHARED_MARK),
        *(prose.SHARED_VARIANT.format(name=name, note=note) for name, note in shared),
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
        named = {"time_to_target": self.to_target_s, "final_accuracy": self.final_accuracy}
        for key, values in named.items():
            out |= {f"{key}_seeds_{f.__name__}": f(values) for f in (min, max) if values}
        return out

    def text(self) -> str:
        """ "3/3 seeds: 1.25–1.31 s, final 99.23–99.31%"."""
        reached, accuracy = self.to_target_s, self.final_accuracy
        lo, hi = (fmt_seconds(f(reached)) if reached else "" for f in (min, max))
        times = f": {lo.removesuffix(' s')}–{hi}" if reached else ""
        return f"{len(reached)}/{self.count} seeds{times}, final {min(accuracy):.2%}–{max(accuracy):.2%}"


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
    """Each compiled variant -> the uncompiled one with the same settings but compile, kernel
    autotuning and cudnn.benchmark (set-up for a faster steady epoch): amp -> amp_uncompiled."""
    differing = {"compile", "kernel_autotune", "cudnn_benchmark"}
    return _twins(rows, differing, lambda v: v.compile == "none")


def _to_target(row: Row, target: float) -> tuple[Figure | None, int | None]:
    """Training time to the first epoch at `target`, with its interval, and that epoch; None,
    None where no epoch reached it."""
    reached = time_to_target(row.epochs, target)
    if reached is None:
        return None, None
    epoch = reached[1]
    # warm-up epochs (the first, a resume's first) stay as measured, less any time stopped,
    # as do stopped ones; the steady epochs are redrawn
    epochs = row.epochs[:epoch]
    settled = steady_epochs(epochs)
    fixed = [e.train_time_s - e.stopped_s for e in epochs if e not in settled]
    return spread.total_after(sum(fixed), [e.train_time_s for e in settled]), epoch


def variant_figures(
    rows: list[Row], baseline: str | None, target: float
) -> dict[str, VariantFigures]:
    """The figures of every trained variant with a steady epoch (two epochs or more)."""
    samples = {r.name: r.steady_samples for r in rows if r.trained and r.steady_samples}
    base = samples.get(baseline)
    twins = fp32_twins(rows)
    out: dict[str, VariantFigures] = {}
    for row in (r for r in rows if r.name in samples):
        mine, twin = samples[row.name], twins.get(row.name)
        twin = twin if twin in samples else None
        speedup = Figure(1.0) if row.name == baseline else None
        if base is not None and row.name != baseline:
            speedup = spread.ratio_of_medians(base, mine)
        steady = spread.median(mine)
        to_target, target_epoch = _to_target(row, target)
        out[row.name] = VariantFigures(
            steady_epoch=steady,
            samples_per_s=steady.inverse(row.train.train_samples),
            speedup=speedup,
            fp32_twin=twin,
            over_fp32=spread.ratio_of_medians(samples[twin], mine) if twin else None,
            to_target=to_target,
            target_epoch=target_epoch,
            seeds=seeds(row, target),
        )
    epochs_of = {r.name: r.epochs for r in rows}
    for name, twin in uncompiled_twins(rows).items():
        if name in out and twin in out:
            saved = out[twin].steady_epoch.value - out[name].steady_epoch.value
            even = break_even(epochs_of[name], epochs_of[twin], saved)
            out[name] = replace(out[name], uncompiled_twin=twin, break_even=even)
    return out


def fmt_speedup(figure: Figure | None) -> str:
    """A speedup with its interval: 12.3× (11.0–13.5×); "n/a" for None."""
    return "n/a" if figure is None else fmt_interval(figure.value, figure.lo, figure.hi, fmt_ratio)


def fmt_time(figure: Figure | None) -> str:
    """A duration with its interval: 0.129 s (0.127–0.131 s); "n/a" for None."""
    f = figure
    return "n/a" if f is None else fmt_interval(f.value, f.lo, f.hi, fmt_seconds)


def fastest(figures: Mapping[str, VariantFigures]) -> str:
    """The variant with the shortest steady epoch."""
    return min(figures, key=lambda n: figures[n].steady_epoch.value)


def first_to_target(figures: Mapping[str, VariantFigures]) -> str | None:
    """The variant that reached the target accuracy in the least training time, if any did."""
    reached = [n for n, f in figures.items() if f.to_target is not None]
    return min(reached, key=lambda n: figures[n].to_target.value) if reached else None


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
    where = {"machine": machine, "stack": f"torch {cpu.software.torch}"}
    skipped = ", ".join(r.name for r in rows if not r.trained)
    if not figures:
        names = prose.NOTHING_SKIPPED.format(names=skipped) if skipped else ""
        return [prose.NOTHING_TO_COMPARE.format(**where, skipped=names)]
    by_name = {r.name: r for r in rows}
    sentences = [_fastest_sentence(by_name, figures, baseline, where)]
    if baseline is not None and baseline not in figures:  # every speedup column reads n/a
        base = by_name.get(baseline)  # skipped, or no steady epoch
        why = prose.BASELINE_NO_STEADY
        if base is not None and isinstance(base.train, Skipped):
            why = prose.BASELINE_SKIPPED.format(reason=base.train.reason)
        sentences.append(prose.NO_SPEEDUPS.format(baseline=baseline, why=why))
    sentences += [
        prose.PRECISION_ALONE.format(
            name=name,
            precision=by_name[name].variant.precision,
            twin=f.fp32_twin,
            speedup=fmt_speedup(f.over_fp32),
        )
        for name, f in figures.items()
        if f.over_fp32 is not None
    ]
    sentences.append(_target_sentence(by_name, figures, target))
    if pays := compiling_pays(figures):
        sentences.append(pays)
    low, high = (f(by_name[n].test_accuracy for n in figures) for f in (min, max))
    accuracy = f"{low:.2%}–{high:.2%}" if f"{low:.2%}" != f"{high:.2%}" else f"{low:.2%}"
    across = prose.ACCURACY_ACROSS if len(figures) > 1 else ""
    names = prose.ACCURACY_SKIPPED.format(names=skipped) if skipped else ""
    return [*sentences, prose.ACCURACY.format(accuracy=accuracy, across=across, skipped=names)]


def _fastest_sentence(
    by_name: Mapping[str, Row],
    figures: Mapping[str, VariantFigures],
    baseline: str | None,
    where: Mapping[str, str],
) -> str:
    name = fastest(figures)
    best, variant = figures[name], by_name[name].variant
    faster, precision = "", variant.precision
    if variant.device == "cpu" and variant.threads:
        precision += f", {variant.threads} threads"
    if best.speedup is not None and name != baseline:
        faster = prose.FASTER_THAN.format(speedup=fmt_speedup(best.speedup), baseline=baseline)
    others = "; ".join(
        f"{other} {fmt_speedup(f.speedup)}"
        for other, f in figures.items()
        if other not in (name, baseline) and f.speedup is not None
    )
    return prose.FASTEST.format(
        **where,
        name=name,
        device=variant.device,
        precision=precision,
        rank=prose.RANK_FIRST if len(figures) > 1 else prose.RANK_ONLY,
        steady=fmt_time(best.steady_epoch),
        faster=faster,
        others=prose.OTHERS.format(others=others) if others else "",
    )


def _target_sentence(
    by_name: Mapping[str, Row], figures: Mapping[str, VariantFigures], target: float
) -> str:
    first = first_to_target(figures)
    if first is None:
        return prose.NO_TARGET.format(target=f"{target:.1%}")
    reached, row = figures[first], by_name[first]
    # what its first epoch paid for: warm-up, and compiling with its cache's state
    cost, state = prose.FIRST_EPOCH_COMPILING, row.train.compile_cache
    if row.variant.compile == "none":
        cost = prose.FIRST_EPOCH_WARM_UP
    elif state:
        cost = prose.FIRST_EPOCH_CACHE.format(state=state)
    missed = ", ".join(n for n, f in figures.items() if f.to_target is None)
    who = prose.TARGET_FIRST if len(figures) > 1 else prose.TARGET_ONLY
    return prose.TO_TARGET.format(
        target=f"{target:.1%}",
        who=who.format(name=first),
        time=fmt_time(reached.to_target),
        epoch=reached.target_epoch,
        cost=cost,
        stage=prose.TARGET_STAGE.format(stage=fmt_seconds(row.stage_to_model_s))
        if row.stage_to_model_s
        else "",
        seeds=prose.TARGET_SEEDS.format(seeds=reached.seeds.text()) if reached.seeds else "",
        missed=prose.TARGET_MISSED.format(names=missed) if missed else "",
    )


def compiling_pays(figures: Mapping[str, VariantFigures]) -> str | None:
    """One sentence: after how many epochs each compiled variant's compiling paid for itself
    against its uncompiled twin, from what it measured; None without such a pair."""
    parts = []
    for name, f in figures.items():
        if (even := f.break_even) is None:
            continue
        cost = prose.PAYS_COST.format(
            name=name,
            first=fmt_seconds(even.first_s),
            twin=f.uncompiled_twin,
            twin_first=fmt_seconds(even.twin_first_s),
        )
        if even.epochs is None:
            parts.append(prose.PAYS_NEVER.format(cost=cost))
            continue
        saved = prose.PAYS_SAVED.format(saved=fmt_seconds(even.saved_s))
        how = prose.PAYS_MEASURED if even.observed else saved
        plural = "s" * (even.epochs != 1)
        parts.append(prose.PAYS_AFTER.format(cost=cost, how=how, epochs=even.epochs, plural=plural))
    return prose.COMPILING_PAYS.format(pairs="; ".join(parts)) if parts else None
