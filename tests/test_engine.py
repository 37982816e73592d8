"""engine.py: fit, evaluate, the train step, the training state, and the run-level summary."""

from __future__ import annotations

import contextlib
import copy
import time
import types
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from accelbench.core.params import TrainParams, VariantParams
from accelbench.core.results import EpochRecord
from accelbench.data.datasets import DATASETS
from accelbench.training import engine, step
from accelbench.training.models import SeedCNN
from helpers import fit_small

FP32 = VariantParams(device="cpu", precision="fp32")


def _train(
    prepared, *, epochs=3, seed=0, variant=FP32, batch_size=64, **overrides
) -> tuple[SeedCNN, list]:
    train = TrainParams(epochs=epochs, batch_size=batch_size, seed=seed, lr=2e-3, **overrides)
    return fit_small(prepared, train, variant)


@pytest.mark.slow
def test_loss_falls_and_accuracy_rises(prepared) -> None:
    _, records = _train(prepared, epochs=3)
    assert [r.epoch for r in records] == [1, 2, 3]
    assert records[-1].train_loss < 0.5 * records[0].train_loss
    assert records[-1].test_accuracy > 0.9  # the synthetic digits are easy
    assert all(r.train_time_s > 0 and r.samples == 512 for r in records)
    assert all(r.nonfinite_steps == 0 for r in records)


def test_same_seed_gives_bitwise_identical_weights(tiny_prepared) -> None:
    first, _ = _train(tiny_prepared, epochs=2, seed=3, batch_size=8)  # 4 steps an epoch
    second, _ = _train(tiny_prepared, epochs=2, seed=3, batch_size=8)
    other, _ = _train(tiny_prepared, epochs=2, seed=4, batch_size=8)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(first.classifier.weight, other.classifier.weight)


def test_the_device_clock_waits_for_the_gpu_before_every_read(monkeypatch) -> None:
    """Every figure's honesty rests on it: a CUDA clock read while kernels are queued times
    their launch, not their run."""
    from accelbench.core.timing import DeviceClock

    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(device))
    gpu = torch.device("cuda", 0)
    clock = DeviceClock(gpu)
    assert clock.now() <= clock.now()
    assert waits == [gpu, gpu]
    DeviceClock(torch.device("cpu")).now()
    assert waits == [gpu, gpu]  # nothing to wait for on the CPU


def test_energy_counter_is_read_around_the_timed_region(tiny_prepared) -> None:
    readings = iter(range(0, 1000, 7))  # a cumulative counter, in joules

    train = TrainParams(epochs=2, batch_size=8)
    hooks = engine.FitHooks(gpu_energy_j=lambda: float(next(readings)))
    _, records = fit_small(tiny_prepared, train, hooks=hooks)
    assert [r.gpu_energy_j for r in records] == [7.0, 7.0]
    assert engine.summarize(records).steady_gpu_energy_j_per_epoch == 7.0
    _, plain = _train(tiny_prepared, epochs=1, batch_size=8)
    assert plain[0].gpu_energy_j is None


def test_a_slow_energy_counter_stays_outside_the_timed_epoch(tiny_prepared) -> None:
    """An NVML energy read takes 2.4 ms on an H100: timed, 3% of amp's 0.08 s epoch."""

    def slow_reading() -> float:
        time.sleep(0.5)
        return 0.0

    hooks = engine.FitHooks(gpu_energy_j=slow_reading, cpu_energy_j=slow_reading)
    _, records = fit_small(tiny_prepared, TrainParams(epochs=1, batch_size=8), hooks=hooks)
    assert records[0].train_time_s < 0.5, records[0].train_time_s  # 4 steps: milliseconds


def _epochs_reading(joules: list[float], epoch_s: float) -> list[EpochRecord]:
    return [
        EpochRecord(
            epoch=i + 1, train_loss=0.1, train_time_s=epoch_s, data_wait_s=0.0, samples=60000,
            samples_per_s=1.0, test_loss=0.1, test_accuracy=0.99, nonfinite_steps=0, lr=1e-3,
            peak_gpu_mem_mib=None, gpu_energy_j=reading, cpu_energy_j=reading,
        )
        for i, reading in enumerate(joules)
    ]  # fmt: skip


def test_steady_energy_is_the_mean_so_a_coarse_counter_averages_out() -> None:
    # An H200's 0.13 s epochs read 37 J or 83 J as the counter's steps fall (docs/results/h200-x2.md).
    records = _epochs_reading([2000.0, 37.0, 83.0, 37.0, 37.0, 83.0, 37.0], 0.13)
    assert engine.summarize(records).steady_gpu_energy_j_per_epoch == 314.0 / 6


def test_epochs_too_short_for_the_counter_have_no_steady_energy_not_zero() -> None:
    # amp's 0.07 s epochs on an H200 all read 0 J: NVML's counter did not advance within any
    # (docs/results/h200-time-to-result-3.md); 0 J would be reported as a measurement.
    summary = engine.summarize(_epochs_reading([2808.8] + [0.0] * 9, 0.07))
    assert summary.steady_gpu_energy_j_per_epoch is None
    assert summary.steady_cpu_energy_j_per_epoch is None


def test_a_fit_resumed_from_its_state_ends_with_the_uninterrupted_weights(tiny_prepared) -> None:
    train = TrainParams(epochs=3, batch_size=8, shift_px=2, schedule="onecycle")  # dropout
    states = []  # copies: a state holds the live weights, as torch.save would read them
    hooks = engine.FitHooks(on_checkpoint=lambda state: states.append(copy.deepcopy(state)))
    whole, records = fit_small(tiny_prepared, train, hooks=hooks)
    assert [s.epochs_done for s in states] == [1, 2, 3]
    resumed, again = fit_small(tiny_prepared, train, resume_from=states[0])
    assert again[0] == records[0]  # restored with the state
    # Each process's first epoch compiled and autotuned: never a steady one.
    assert [r.warm_up for r in records] == [True, False, False]
    assert [r.warm_up for r in again] == [True, True, False]
    assert engine.summarize(again).steady_epochs_s == [again[2].train_time_s]
    figures = [(r.epoch, r.train_loss, r.test_loss, r.lr) for r in records]
    assert [(r.epoch, r.train_loss, r.test_loss, r.lr) for r in again] == figures
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name


def test_the_parts_outside_the_timed_epochs_are_handed_to_the_hooks(tiny_prepared) -> None:
    seen = []

    hooks = engine.FitHooks(phase=lambda part: contextlib.nullcontext(seen.append(part)))
    fit_small(tiny_prepared, TrainParams(epochs=2, batch_size=8), hooks=hooks)
    assert seen == ["step_setup", "evaluation", "evaluation"]


def test_onecycle_schedule_changes_lr_per_step(tiny_prepared) -> None:
    # 16 steps, as 512 images in batches of 64 made: the rate anneals to its end
    _, records = _train(tiny_prepared, epochs=2, batch_size=4, schedule="onecycle")
    assert records[0].lr != records[1].lr
    assert records[-1].lr < 0.05 * 2e-3 * 10  # annealed to a few % of the peak rate by the end


def test_bf16_autocast_on_cpu_trains(prepared) -> None:
    _, records = _train(prepared, epochs=1, variant=VariantParams(device="cpu", precision="bf16"))
    assert records[0].test_accuracy > 0.3


def test_flops_per_sample_matches_the_architecture() -> None:
    forward = 2 * (26 * 26 * 32 * 9 + 24 * 24 * 64 * 32 * 9 + 9216 * 10)
    flops = engine.train_flops_per_sample(SeedCNN(), (1, 28, 28))
    assert 2.9 * forward < flops < 3.1 * forward  # backward is about twice the forward pass


def _record(epoch, time_s, acc) -> EpochRecord:
    return EpochRecord(epoch, 1.0, time_s, 0.0, 100, 100 / time_s, 1.0, acc, 0, 1e-3, None)


def test_summarize_separates_first_epoch_from_the_steady_state() -> None:
    records = [
        _record(1, 5.0, 0.9),
        _record(2, 1.0, 0.985),
        _record(3, 2.0, 0.991),
        _record(4, 1.5, 0.99),
    ]
    summary = engine.summarize(records)
    assert summary.first_epoch_s == 5.0
    assert summary.steady_epoch_s == 1.5 and summary.steady_epochs_s == [1.0, 2.0, 1.5]
    assert summary.total_train_s == 9.5
    assert summary.best_test_accuracy == 0.991
    assert engine.summarize(records[:1]).steady_epoch_s is None
    resumed = [*records[:2], replace(records[2], warm_up=True), records[3]]
    assert engine.summarize(resumed).steady_epochs_s == [1.0, 1.5]
    assert engine.summarize(resumed).total_train_s == 9.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_amp_and_fp32_losses_agree_on_one_batch() -> None:
    device = torch.device("cuda")
    engine.seed_everything(0)
    model = SeedCNN().to(device).eval()
    x = torch.randn(256, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (256,), device=device)
    reference = torch.nn.functional.cross_entropy(model(x), y)
    for precision, tol in (("bf16", 2e-2), ("fp16", 5e-3)):
        with step.autocast(VariantParams(device="cuda", precision=precision), device):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        assert abs(loss.item() - reference.item()) / reference.item() < tol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_captured_step_matches_eager_steps(prepared) -> None:
    """Warm-up for capture is undone: the graphed run trains like the eager one."""
    device = torch.device("cuda")
    train = TrainParams(epochs=2, batch_size=100, seed=0, schedule="onecycle")  # 512 = 5x100 + 12
    weights = {}
    for graphed in (False, True):
        variant = VariantParams(device="cuda", precision="fp32", cuda_graph=graphed)
        engine.configure_backends(variant)
        torch.backends.cudnn.deterministic = True
        engine.seed_everything(0)
        model = SeedCNN(dropout=0.0).to(device)
        # Every warning, not once per process (autograd's stream warning is TORCH_WARN_ONCE).
        torch.set_warn_always(True)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _, records = fit_small(prepared, train, variant, device, model=model)
        finally:
            torch.set_warn_always(False)
        # The captured step and the eager partial batch (12 of 512) share no autograd nodes.
        assert not [w for w in caught if "AccumulateGrad" in str(w.message)]
        weights[graphed] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        assert records[-1].samples == 512
    engine.seed_everything(0)
    initial = SeedCNN(dropout=0.0).state_dict()
    for name, eager in weights[False].items():
        moved = (eager - initial[name]).abs().max().item()
        diff = (weights[True][name] - eager).abs().max().item()
        # Three un-undone warm-up steps would move weights by ~3 x lr; rounding differences
        # between the capturable and the plain Adam are orders of magnitude smaller.
        assert diff < 0.02 * moved, (
            f"{name}: graph vs eager differ by {diff:.2e}, training moved {moved:.2e}"
        )


def test_random_shift_translates_each_image_within_bounds() -> None:
    torch.manual_seed(0)
    images = torch.randn(16, 1, 28, 28)
    shifted = step.random_shift(images, 2, fill=-9.0)
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2), value=-9.0)
    offsets = set()
    for i in range(16):
        matches = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(padded[i, 0, dy : dy + 28, dx : dx + 28], shifted[i, 0])
        ]
        assert len(matches) == 1, f"image {i} is not a translation of its input"
        offsets.add(matches[0])
    assert len(offsets) > 3  # each image draws its own offset


def test_random_shift_moves_every_channel_of_an_image_together() -> None:
    torch.manual_seed(0)
    images = torch.randn(8, 3, 32, 32)
    shifted = step.random_shift(images, 2, fill=-1.0)
    assert shifted.shape == images.shape
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2), value=-1.0)
    for i in range(8):
        matches = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(padded[i, :, dy : dy + 32, dx : dx + 32], shifted[i])
        ]
        assert len(matches) == 1, f"image {i}: its channels are not one translation of its input"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_captured_step_with_random_shifts_trains(prepared) -> None:
    device = torch.device("cuda")
    train = TrainParams(epochs=2, batch_size=128, seed=0, shift_px=2, lr=2e-3)
    variant = VariantParams(device="cuda", precision="bf16", cuda_graph=True, channels_last=True)
    engine.seed_everything(0)
    model = SeedCNN().to(device, memory_format=torch.channels_last)
    _, records = fit_small(prepared, train, variant, device, model=model)  # channels_last batches
    assert records[-1].train_loss < records[0].train_loss
    assert all(r.nonfinite_steps == 0 for r in records)


# --- faults: non-finite losses, GradScaler, determinism, accumulation ------------------------


def _poison_cross_entropy(monkeypatch, bad_calls) -> None:
    """Training steps whose 1-based call number `bad_calls(n)` accepts get an infinite loss."""
    calls = {"n": 0}

    def cross_entropy(logits, labels, **kwargs):
        loss = F.cross_entropy(logits, labels, **kwargs)
        if logits.requires_grad:  # training steps only
            calls["n"] += 1
            if bad_calls(calls["n"]):
                loss = loss * float("inf")
        return loss

    monkeypatch.setattr(step, "F", types.SimpleNamespace(cross_entropy=cross_entropy, pad=F.pad))


def test_consecutive_nonfinite_losses_fail_naming_epoch_and_step(
    tiny_prepared, monkeypatch
) -> None:
    _poison_cross_entropy(monkeypatch, lambda n: n > 5)  # from epoch 2, step 2 on
    train = TrainParams(epochs=3, batch_size=8, max_nonfinite_steps=2)  # 4 steps an epoch
    with pytest.raises(engine.NonFiniteLossError, match=r"epoch 2, step 3: 2 consecutive") as info:
        fit_small(tiny_prepared, train)
    assert "lower train.lr" in str(info.value)


def test_the_limit_counts_consecutive_steps_only() -> None:
    finite = torch.tensor([True, False, True, False, False, True])
    engine.check_nonfinite(finite, 1, 3, VariantParams(device="cpu"))  # two in a row: allowed
    fp16 = VariantParams(device="cuda", precision="fp16")
    with pytest.raises(engine.NonFiniteLossError, match=r"epoch 4, step 5.*precision 'bf16'"):
        engine.check_nonfinite(finite, 4, 2, fp16)


def test_gradscaler_skipped_steps_are_counted(tiny_prepared, monkeypatch) -> None:
    """fp16 + GradScaler, on the CPU: an inf loss gives inf gradients, a skipped step. CPU fp16
    is slow, so 32 images in batches of 8: the same 4 steps an epoch at a sixteenth the work."""
    _poison_cross_entropy(monkeypatch, lambda n: n in (2, 3))  # epoch 1 of 4 steps
    fp16 = VariantParams.model_construct(device="cpu", precision="fp16")  # GPU-only in params
    train = TrainParams(epochs=2, batch_size=8, shift_px=0)
    model, records = fit_small(tiny_prepared, train, fp16)
    assert [r.samples for r in records] == [32, 32]
    assert [r.scaler_skipped_steps for r in records] == [2, 0]
    assert [r.nonfinite_steps for r in records] == [2, 0]
    assert all(torch.isfinite(p).all() for p in model.parameters())  # never trained on inf
    assert engine.summarize(records).scaler_skipped_steps == 2


def test_deterministic_mode_gives_identical_weights(tiny_prepared) -> None:
    variant = VariantParams(device="cpu")
    train = TrainParams(epochs=1, batch_size=8, deterministic=True, shift_px=2)
    environ: dict[str, str] = {}
    engine.request_determinism(environ)
    assert environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    weights = []
    try:
        for _ in range(2):
            engine.configure_backends(variant, train.deterministic)
            assert torch.are_deterministic_algorithms_enabled()
            model, _ = fit_small(tiny_prepared, train, variant)
            weights.append(model.state_dict())
    finally:
        engine.configure_backends(variant, False)
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name


def test_accumulated_chunks_give_the_update_of_one_whole_batch(tiny_prepared) -> None:
    """Adam divides by sqrt(v): where a gradient is near zero, summing in another order moves a
    weight by up to 2.2e-6 on a 2-core host, so weights agree to 1% of an lr-1e-3 step."""
    weights = {}
    for k in (1, 4):
        train = TrainParams(epochs=1, batch_size=8, dropout=0.0, accumulation_steps=k)
        model, records = fit_small(tiny_prepared, train, accumulation_steps=k)
        weights[k] = (model.state_dict(), records[0].train_loss)
    for name, value in weights[1][0].items():
        torch.testing.assert_close(weights[4][0][name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert abs(weights[4][1] - weights[1][1]) < 1e-5


def test_fit_takes_accumulation_as_its_argument_not_from_the_recipe(tiny_prepared) -> None:
    """OOM retries change the passes per step; fit must use what it is given."""
    train = TrainParams(epochs=1, batch_size=8, dropout=0.0, accumulation_steps=4)
    _, given = fit_small(tiny_prepared, train, accumulation_steps=1)
    _, whole = fit_small(tiny_prepared, train.model_copy(update={"accumulation_steps": 1}))
    assert given[0].train_loss == whole[0].train_loss


@pytest.mark.gpu
def test_deterministic_mode_on_the_gpu(prepared) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cuda, variant = torch.device("cuda"), VariantParams(device="cuda")
    train = TrainParams(epochs=1, batch_size=128, deterministic=True)
    weights = []
    try:
        for _ in range(2):
            engine.configure_backends(variant, True)
            model, _ = fit_small(prepared, train, variant, cuda)  # seeded with train.seed 0
            weights.append({k: v.cpu() for k, v in model.state_dict().items()})
    finally:
        engine.configure_backends(variant, False)
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name


def test_compile_cache_state_reads_torch_compiles_cache_counters(monkeypatch) -> None:
    from collections import Counter, defaultdict

    import torch._dynamo.utils

    from accelbench.training import compile_cache

    def counters(fx_hit=0, fx_miss=0, aot_hit=0, aot_miss=0):
        table = defaultdict(Counter)
        table["inductor"].update(fxgraph_cache_hit=fx_hit, fxgraph_cache_miss=fx_miss)
        table["aot_autograd"].update(autograd_cache_hit=aot_hit, autograd_cache_miss=aot_miss)
        return table

    for table, expected in [
        (counters(), None),
        (counters(aot_hit=2, fx_hit=2), "warm"),
        (counters(fx_miss=2, aot_miss=2), "cold"),
        (counters(fx_hit=1, fx_miss=1), "partial"),
    ]:
        monkeypatch.setattr(torch._dynamo.utils, "counters", table)
        state = compile_cache.state(compile_cache.counts(), compile_cache.Loaded())
        assert state == expected


def test_the_flop_count_is_shared_through_its_cache(tmp_path, monkeypatch) -> None:
    from accelbench.training import build

    mnist, model = DATASETS["mnist"], SeedCNN()
    cache = tmp_path / "flops.json"
    first = build.flops_per_sample(mnist, model, cache=cache)
    assert first == build.flops_per_sample(mnist, model)  # the same count, uncached

    def must_not_count(model, input_shape) -> int:
        raise AssertionError("counted again despite the cache")

    monkeypatch.setattr(engine, "train_flops_per_sample", must_not_count)
    assert build.flops_per_sample(mnist, SeedCNN(), cache=cache) == first  # the same layers
    cache.write_text("{broken")
    monkeypatch.undo()
    assert build.flops_per_sample(mnist, model, cache=cache) == first  # broken: counted again


@pytest.mark.slow
def test_a_compiled_variant_compiles_the_whole_loss_and_trains_like_the_eager_one(
    prepared, monkeypatch
) -> None:
    """torch.compile gets augmentation, forward and loss as one function (Inductor on a GPU;
    here the aot_eager backend, which runs the same traced graphs without generating code)."""
    compiled_calls, tunings = [], []
    real_compile = torch.compile

    def compile_on_cpu(fn, *, dynamic=None, **tuning):
        tunings.append(tuning)
        compiled = real_compile(fn, backend="aot_eager", dynamic=dynamic)

        def counted(images, labels):
            compiled_calls.append(len(labels))
            return compiled(images, labels)

        return counted

    monkeypatch.setattr(torch, "compile", compile_on_cpu)
    # shift_px: the augmentation (and its padding value) is inside the compiled loss
    train = TrainParams(epochs=2, batch_size=100, seed=0, dropout=0.0, shift_px=2)  # 5x100+12
    weights = {}
    for mode in ("none", "default"):
        compiled_calls.clear()
        tuned = {} if mode == "none" else {"kernel_autotune": False}
        variant = VariantParams(device="cpu", precision="fp32", compile=mode, **tuned)
        model, records = fit_small(prepared, train, variant)
        weights[mode] = model.state_dict()
        assert records[-1].samples == 512
    assert compiled_calls == [100] * 10  # full batches only: the partial ones ran eagerly
    # kernel_autotune: false reaches Inductor as its option (one launch config per kernel)
    assert tunings == [{"options": {"triton.autotune_pointwise": False}}]
    engine.seed_everything(train.seed)
    initial = SeedCNN(dropout=0.0).state_dict()
    for name, eager in weights["none"].items():
        moved = (eager - initial[name]).abs().max().item()
        diff = (weights["default"][name] - eager).abs().max().item()
        # the same arithmetic in another order (conv1 as multiply-adds): rounding, which
        # Adam's normalized steps can grow to a few percent of 10 small steps, no more
        assert diff < 0.05 * moved, f"{name}: compiled vs eager {diff:.2e}, moved {moved:.2e}"
