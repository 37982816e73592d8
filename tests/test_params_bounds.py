"""Params bounded where a value can hurt (issue 24): finite floats, seeds numpy and torch accept,
threads and processes per CPU, params.yaml's size and alias expansion capped, and error lines
that quote at most a short piece of a value. Each is refused by `accelbench check`, run as a
user runs it, before any work starts."""

from __future__ import annotations

import copy
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelbench.core import params as params_module
from accelbench.core.params import ParamsError, cpu_limit, load_params, parse_params
from accelbench.core.problems import MAX_PROBLEMS
from helpers import REPO

TEXT = (REPO / "params.yaml").read_text()


@pytest.fixture
def raw() -> dict:
    return yaml.safe_load(TEXT)


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    assert old in TEXT
    path = tmp_path / "params.yaml"
    path.write_text(TEXT.replace(old, new, 1))
    return path


def _error(raw: dict) -> str:
    with pytest.raises(ParamsError) as info:
        parse_params(raw)
    return str(info.value)


def _limit_memory() -> None:  # a regression fails the test, not the machine running it
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _check(params: Path | str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`accelbench --params PARAMS check`, in a process of at most 2 GiB."""
    return subprocess.run(
        [sys.executable, "-m", "accelbench.cli", "--params", str(params), "check"],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limit_memory,
    )


def _refused(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} not in {result.stderr!r}"
    return result.stderr


# --- finite floats -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("lr: 0.001", "lr: .inf", "train.lr = inf"),
        ("lr: 0.001", "lr: .nan", "train.lr = nan"),
        ("dropout: 0.25", "dropout: .NaN", "train.dropout = nan"),
        ("onecycle_max_lr_factor: 10", "onecycle_max_lr_factor: .inf", "onecycle_max_lr_factor"),
        ("target_accuracy: 0.99", "target_accuracy: .nan", "train.target_accuracy = nan"),
        ("kwh_usd: 0.15", "kwh_usd: .inf", "cost.kwh_usd = inf"),
        ("gpu_hour_usd: 0.13", "gpu_hour_usd: -.inf", "cost.gpu_hour_usd = -inf"),
        ("timeout_s: 30", "timeout_s: .inf", "data.timeout_s = inf"),
    ],
)
def test_non_finite_floats_are_refused_before_any_work(tmp_path, old, new, key) -> None:
    _refused(_check(_edited(tmp_path, old, new)), key, "must be a finite number")


def test_every_float_of_every_section_is_finite(raw) -> None:
    """Not only the keys above: a float anywhere (a new key too) refuses .inf and .nan."""
    floats = [
        (section, key)
        for section in ("data", "train", "cost")
        for key, value in raw[section].items()
        if isinstance(value, float)
    ]
    assert len(floats) >= 6
    for section, key in floats:
        bad = copy.deepcopy(raw)
        bad[section][key] = float("inf")
        with pytest.raises(ParamsError, match=rf"{section}\.{key} = inf: must be a finite"):
            parse_params(bad)


# --- seeds -------------------------------------------------------------------------------------


def test_seeds_beyond_what_numpy_accepts_are_refused_by_check(tmp_path) -> None:
    """A 14-digit seed passed `check`, then `train` died with "unexpected ValueError"."""
    stderr = _refused(
        _check(_edited(tmp_path, "seed: 0", "seed: 12345678901234")),
        "train.seed = 12345678901234",
        "4294967295",
        "numpy and torch",
    )
    assert len(stderr.splitlines()) == 1
    _refused(_check(_edited(tmp_path, "seed: 0", "seed: -1")), "train.seed = -1")


def test_the_largest_seed_allowed_seeds_numpy_torch_and_the_epoch_order(raw) -> None:
    import numpy as np

    from accelbench.data import batches
    from accelbench.training import engine

    raw["train"]["seed"] = 2**32 - 1
    seed = parse_params(raw).train.seed
    engine.seed_everything(seed)
    np.random.seed(seed)
    np.random.default_rng(seed)
    assert sorted(batches.epoch_permutation(seed, 10_000, 8).tolist()) == list(range(8))
    sampler = batches.EpochSampler(16, seed, rank=1, world_size=2)
    sampler.set_epoch(3)
    assert len(list(sampler)) == 8
    raw["train"]["seed"] = 2**32
    with pytest.raises(ParamsError, match="less than or equal to 4294967295"):
        parse_params(raw)


# --- threads and processes ---------------------------------------------------------------------


def test_threads_beyond_a_multiple_of_the_cpus_are_refused_naming_the_limit(tmp_path) -> None:
    limit = cpu_limit()
    assert limit == params_module.PER_CPU * os.cpu_count()
    path = _edited(
        tmp_path,
        "    device: cpu\n",
        "    device: cpu\n    threads: 10000\n",
    )
    _refused(
        _check(path),
        "variants.cpu.threads = 10000",
        f"{params_module.PER_CPU} per logical CPU",
        f"({os.cpu_count()} CPUs)",
        f"use at most {limit}",
    )
    path.write_text(path.read_text().replace("threads: 10000", f"threads: {limit}"))
    assert _check(path).returncode == 0


def test_loader_workers_and_cpu_processes_are_bounded_alike(raw) -> None:
    limit = cpu_limit()
    raw["variants"]["gpu_dataloader"]["loader"]["num_workers"] = limit + 1
    raw["variants"]["cpu_ddp"] = {"device": "cpu", "distributed": {"nproc_per_node": limit + 2}}
    raw["train"]["batch_size"] = 512 * (limit + 2)  # divisible by the world size
    message = _error(raw)
    assert f"loader.num_workers = {limit + 1}: more worker processes than" in message
    assert f"more distributed.nproc_per_node than {params_module.PER_CPU} per logical" in message
    raw["variants"]["gpu_dataloader"]["loader"]["num_workers"] = limit
    raw["variants"]["cpu_ddp"]["distributed"]["nproc_per_node"] = 2
    raw["train"]["batch_size"] = 512
    assert parse_params(raw).variants["gpu_dataloader"].loader.num_workers == limit


# --- the file itself ---------------------------------------------------------------------------


def _bomb(levels: int = 9) -> str:
    """A "billion laughs": each level 10 aliases of the one before, 10**(levels+1) values."""
    lines = ["lol0: &lol0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels + 1):
        ref = f"*lol{level - 1}"
        lines.append(f"lol{level}: &lol{level} [{', '.join([ref] * 10)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_in_a_fraction_of_a_second(tmp_path) -> None:
    """Before: `accelbench check` validated the expanded document and ran out of memory (DVC
    does too, in its own reading of params.yaml, before any stage runs)."""
    path = tmp_path / "params.yaml"
    mirrors = "  mirrors:\n  - https://ossci-datasets.s3.amazonaws.com/mnist/\n"
    mirrors += "  - http://yann.lecun.com/exdb/mnist/\n"
    assert mirrors in TEXT
    path.write_text(_bomb() + TEXT.replace(mirrors, "  mirrors: *lol9\n"))
    stderr = _refused(_check(path, timeout=30), "refused", "more than 100000 values", "aliases")
    assert len(stderr.splitlines()) == 1


def test_self_referring_aliases_and_deep_nesting_are_refused(tmp_path) -> None:
    _refused(_check(_edited(tmp_path, "dataset: mnist", "dataset: &c [*c]")), "contains it")
    deep = "[" * 2000 + "]" * 2000
    _refused(_check(_edited(tmp_path, "dataset: mnist", f"dataset: {deep}")), "nested deeper")


def test_aliases_within_the_cap_still_work(tmp_path) -> None:
    """Anchors are YAML a user may write: one mirror list shared by both datasets is fine."""
    path = _edited(tmp_path, "  mirrors:\n", "  mirrors: &mirrors\n")
    text = path.read_text().replace(
        "  cifar10_mirrors:\n  - https://www.cs.toronto.edu/~kriz/\n",
        "  cifar10_mirrors: *mirrors\n",
    )
    path.write_text(text)
    params = load_params(path)
    assert params.data.cifar10_mirrors == params.data.mirrors and len(params.data.mirrors) == 2


def test_an_oversized_or_endless_params_file_is_refused_unread(tmp_path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(TEXT + "# " + "x" * params_module.MAX_BYTES + "\n")
    _refused(_check(path), "larger than the 1024 KiB a params file may have")
    _refused(_check("/dev/zero", timeout=30), "/dev/zero: is a special file (a FIFO, a device")


def test_an_integer_too_long_to_read_is_refused(tmp_path) -> None:
    _refused(_check(_edited(tmp_path, "seed: 0", "seed: " + "9" * 5000)), "more than 4300 digits")


# --- error lines stay short --------------------------------------------------------------------


def test_a_huge_value_is_echoed_cut_short(tmp_path, raw) -> None:
    """Before: a 5 MB value came back in a 5 MB error line."""
    huge = "x" * 5_000_000
    for section, key in (("data", "dataset"), ("data", "mirrors"), ("variants", "cpu")):
        bad = copy.deepcopy(raw)
        bad[section][key] = [f"ftp://{huge}"] if key == "mirrors" else huge
        message = _error(bad)
        assert len(message) < 600 and "…" in message, message[:1000]
    bad = copy.deepcopy(raw)
    bad["train"][huge] = 1  # an unknown key as long
    message = _error(bad)
    assert len(message) < 600 and "unknown key" in message
    # the same through the CLI, with a value as large as a params file may hold
    path = _edited(tmp_path, "dataset: mnist", "dataset: " + "y" * 900_000)
    stderr = _refused(_check(path), "data.dataset = 'yyyy", "y…: Input should be 'mnist'")
    assert len(stderr) < 600


def test_a_flood_of_problems_is_listed_up_to_a_limit(raw) -> None:
    raw["variants"] = {f"v{i}": {"device": "tpu"} for i in range(500)}
    raw["report"] = {}
    raw["quantize"] = {}
    message = _error(raw)
    assert "(500 problems)" in message and "... and 480 more" in message
    assert len(message.splitlines()) == MAX_PROBLEMS + 2


# --- batches no larger than their set ----------------------------------------------------------


def test_a_batch_larger_than_its_set_is_refused_naming_the_limit(tmp_path) -> None:
    """`train.batch_size: 1000000` was accepted and trained on the CPU until killed."""
    huge = _edited(tmp_path, "batch_size: 512", "batch_size: 1000000")
    _refused(_check(huge), "train.batch_size = 1000000: at most the 60000 training images mnist")
    (tmp_path / "eval").mkdir()
    wide = _edited(tmp_path / "eval", "eval_batch_size: 2048", "eval_batch_size: 10001")
    _refused(_check(wide), "train.eval_batch_size = 10001: at most the 10000 test images mnist")


def test_train_subset_bounds_the_batch_and_test_subset_does_not(raw) -> None:
    raw["train"] |= {"train_subset": 256, "test_subset": 256}
    assert "train.batch_size = 512: at most the 256 training images train.train_subset leaves" in (
        _error(raw)
    )
    raw["train"]["batch_size"] = 256  # the whole subset in one batch; evaluation's may be larger
    assert parse_params(raw).train.eval_batch_size == 2048


def test_make_repro_refuses_an_alias_bomb_in_one_line_before_dvc_starts(tmp_path) -> None:
    """Before: `make repro` ran `dvc repro`, which died with a MemoryError inside DVC."""
    (tmp_path / "params.yaml").write_text(
        _bomb() + TEXT.replace("dataset: mnist", "dataset: *lol9")
    )
    (tmp_path / "uv.lock").symlink_to(REPO / "uv.lock")  # the Makefile reads uv's version there
    env = {**os.environ, "ACCELBENCH_ENV": str(Path(sys.executable).parents[1])}  # no uv sync
    make = ["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "repro"]
    result = subprocess.run(
        make, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        preexec_fn=_limit_memory,
    )  # fmt: skip
    ours, made = result.stderr.splitlines()  # dvc, not started, said nothing
    assert result.returncode != 0 and "Error 2" in made
    assert ours.startswith("accelbench check: error: ") and "more than 100000 values" in ours
    assert "dvc" not in result.stdout.lower() + ours.lower()
