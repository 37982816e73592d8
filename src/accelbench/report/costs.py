"""What a training run costs in money: its energy at a price per kWh, plus its time at a
price per machine hour (tutorial B's cost analysis, for the user's own prices).

Energy is measured where the machine lets us: the GPU boards' counters (NVML) and the CPU
packages' (RAPL), read around every epoch's timed training. Where neither was read, it is
the stated system wattage times the training time. Pure: epoch records and prices in,
figures out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from accelbench.core.params import CostParams
from accelbench.core.results import EpochRecord, energy_read

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class RunCost:
    """The cost of some epochs of one variant's training (time: training only)."""

    train_s: float
    energy_j: float
    energy_source: str  # "measured: " which counters, or "estimated: " the stated wattage
    energy_usd: float
    time_usd: float

    @property
    def total_usd(self) -> float:
        return self.energy_usd + self.time_usd


def _measured(
    counter: str, epochs: Sequence[EpochRecord], run: Sequence[EpochRecord]
) -> float | None:
    """The sum of a counter's readings over `epochs`; None (not measured) unless it measured
    every epoch of the `run` they are from (`energy_read`: a counter whose steady epochs all
    read 0 J did not measure them)."""
    if not energy_read(run, counter):
        return None
    return float(sum(getattr(e, counter) for e in epochs))


def run_cost(
    epochs: Sequence[EpochRecord],
    device: str,
    processes: int,
    prices: CostParams,
    run: Sequence[EpochRecord] | None = None,
) -> RunCost:
    """The cost of `epochs` (epochs.csv's records, the first ones of the `run`: all of it by
    default) of a variant on `device` with `processes` processes (GPUs, for a DDP variant:
    each GPU's system wattage and hour are counted)."""
    run, cuda = epochs if run is None else run, device == "cuda"
    train_s = float(sum(e.train_time_s for e in epochs))
    gpu_j = _measured("gpu_energy_j", epochs, run) if cuda else None
    cpu_j = _measured("cpu_energy_j", epochs, run)
    gpu = "GPU boards (NVML)" if processes > 1 else "GPU board (NVML)"
    parts = [part for part, j in ((gpu, gpu_j), ("CPU packages (RAPL)", cpu_j)) if j is not None]
    if parts:
        energy_j = (gpu_j or 0.0) + (cpu_j or 0.0)
        source = "measured: " + " + ".join(parts)
    else:
        stated = prices.gpu_system_w if cuda else prices.cpu_system_w
        energy_j = stated * (processes if cuda else 1) * train_s
        systems = f"{processes} × " if cuda and processes > 1 else ""
        source = f"estimated: {systems}{stated:g} W (stated) × time"
    hour_usd = prices.gpu_hour_usd * processes if cuda else prices.cpu_hour_usd
    return RunCost(
        train_s=train_s,
        energy_j=energy_j,
        energy_source=source,
        energy_usd=energy_j / J_PER_KWH * prices.kwh_usd,
        time_usd=train_s / 3600 * hour_usd,
    )


def costs_to_target(
    epochs: Sequence[EpochRecord], device: str, processes: int, prices: CostParams, target: float
) -> tuple[RunCost, RunCost | None]:
    """The whole run's cost, and the cost up to the first epoch that reached `target` test
    accuracy (None: none did)."""
    whole = run_cost(epochs, device, processes, prices)
    reached = next((n for n, e in enumerate(epochs, start=1) if e.test_accuracy >= target), None)
    upto = run_cost(epochs[:reached], device, processes, prices, run=epochs) if reached else None
    return whole, upto


def usd_per_1000(per_run: float) -> str:
    """A run's cost as dollars per 1,000 runs: readable where one run costs a fraction of a
    cent."""
    value = 1000 * per_run
    return f"${value:,.2f}" if value >= 0.01 else f"${value:.4f}"
