"""Where a stage's wall time goes: exclusive phase times, the timing files, the report's table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelbench.core import phases
from accelbench.core.phases import Recorder, StageTiming
from accelbench.report import pipeline_time
from helpers import write_params


def test_a_nested_phase_counts_for_itself_only() -> None:
    recorder = Recorder()
    with recorder.phase("training"):
        time.sleep(0.05)
        with recorder.phase("evaluation"):
            time.sleep(0.1)
        time.sleep(0.05)
    assert recorder.seconds["evaluation"] == pytest.approx(0.1, abs=0.03)
    assert recorder.seconds["training"] == pytest.approx(0.1, abs=0.03)


def test_the_time_to_a_model_leaves_the_repeats_out() -> None:
    """A train stage's time to its model is its wall time less its repeats' (their
    train.json's `repeats_wall_s`, which `record_sharing` hands the recorder)."""
    recorder = Recorder()
    recorder.repeats_s = 0.25
    timing = recorder.timing()
    assert timing.repeats_s == 0.25
    assert timing.to_model_s == pytest.approx(max(timing.wall_s - 0.25, 0.0))
    assert StageTiming("train@cpu", 0.0, 20.0, {}, repeats_s=5.0).to_model_s == 15.0
    assert StageTiming("train@cpu", 0.0, 20.0, {}).to_model_s == 20.0  # no repeats: the wall


@pytest.mark.parametrize("name", ["compiling", "fit_setup"])  # fit_setup is derived
def test_an_unknown_or_derived_phase_is_refused(name) -> None:
    with (
        pytest.raises(ValueError, match=f"unknown phase '{name}'; a stage records: startup"),
        Recorder().phase(name),
    ):
        pass


def test_the_process_start_is_before_now_and_recent() -> None:
    started = phases.process_started()
    assert phases.boot_clock() - 3600 < started <= phases.boot_clock()


def test_timings_round_trip_and_unreadable_files_are_left_out(tmp_path) -> None:
    timing = StageTiming("train@amp", 1000.0, 20.0, {"imports": 3.0, "training": 10.0}, 9.5)
    phases.write(tmp_path, timing)
    (tmp_path / phases.TIMINGS_DIR / "broken.json").write_text("{not json")
    (tmp_path / phases.TIMINGS_DIR / "other.json").write_text(json.dumps({"stage": "x"}))
    negative = timing.to_json() | {"stage": "env", "wall_s": -7166.3}  # the wall clock set back
    (tmp_path / phases.TIMINGS_DIR / "env.json").write_text(json.dumps(negative))
    assert phases.read_all(tmp_path) == [timing]
    assert timing.overhead_s == pytest.approx(10.5)
    assert timing.other_s == pytest.approx(7.0)


def _timing(
    stage: str, started: float, wall: float, training: float | None = None, by: str | None = "1@0"
) -> StageTiming:
    return StageTiming(stage, started, wall, {"imports": wall / 2}, training, by, started)


def test_the_pipeline_table_totals_this_repro_and_marks_stages_that_were_up_to_date() -> None:
    earlier = _timing("train@cpu", 100.0, 50.0, 40.0, by="7@50")  # an earlier dvc repro
    env = _timing("env", 1000.0, 2.0)
    train = _timing("train@gpu", 1003.0, 20.0, 12.0)
    compare = _timing("compare", 1025.0, 3.0)
    pipeline = pipeline_time.collect([compare, train, earlier, env], compare)
    assert [t.stage for t in pipeline.stages] == ["env", "train@cpu", "train@gpu", "compare"]
    assert pipeline.this_run == {"env", "train@gpu", "compare"}
    assert pipeline.wall_s == pytest.approx(25.0)
    assert pipeline.training_s == pytest.approx(12.0)
    assert pipeline.overhead_s == pytest.approx(13.0)
    assert pipeline.span_s == pytest.approx(28.0)
    assert pipeline.between_stages_s == pytest.approx(3.0)
    text = "\n".join(pipeline_time.markdown(pipeline))
    assert "| *train@cpu (up to date)* | 50.0 s | 40.0 s |" in text
    assert "| train@gpu | 20.0 s | 12.0 s | 8.0 s | imports 10.0, other 10.0 |" in text
    assert "| compare (until this report) | 3.0 s |" in text  # its MLflow logging comes after
    assert (
        "DVC's own work between the stages (hashing, dvc.lock, starting each stage's process "
        "and waiting for it to exit): 3.0 s" in text
    )
    stages = json.loads(json.dumps(pipeline.to_json()))["stages"]
    assert stages["train@cpu"]["this_run"] is False
    assert stages["compare"]["until_this_report"] and not stages["env"]["until_this_report"]


def test_back_to_back_repros_are_told_apart_by_their_dvc_process() -> None:
    """`dvc repro -s train@gpu compare` right after a whole repro: env is not in this one."""
    env = _timing("env", 1000.0, 2.0, by="7@50")
    earlier = _timing("train@cpu", 1003.0, 50.0, 40.0, by="7@50")
    train = _timing("train@gpu", 1055.0, 20.0, 12.0, by="9@1054")
    compare = _timing("compare", 1076.5, 3.0, by="9@1054")
    pipeline = pipeline_time.collect([env, earlier, train], compare)
    assert pipeline.this_run == {"train@gpu", "compare"}
    assert pipeline.span_s == pytest.approx(24.5) and pipeline.between_stages_s == pytest.approx(
        1.5
    )


def test_run_by_hand_there_is_no_span_and_every_stage_shows_as_last_run() -> None:
    compare = _timing("compare", 9025.0, 3.0, by=None)
    pipeline = pipeline_time.collect([_timing("train@gpu", 1003.0, 20.0, 12.0)], compare)
    assert pipeline.this_run == {"train@gpu", "compare"} and pipeline.span_s is None
    assert "DVC's own work" not in "\n".join(pipeline_time.markdown(pipeline))


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["/repo/.venv/bin/python", "/repo/.venv/bin/dvc", "repro"], True),
        (["dvc", "exp", "run"], True),
        (["python3", "-m", "dvc", "repro"], True),
        (["/bin/sh", "-c", "accelbench train cpu"], False),
        (["python3", "-m", "accelbench.cli", "train"], False),
        ([], False),
    ],
)
def test_a_dvc_process_is_recognized_by_its_command_line(cmdline, expected) -> None:
    assert phases.is_dvc(cmdline) is expected


def test_training_outside_the_timed_epochs_is_overhead_named_fit_setup() -> None:
    timing = StageTiming("train@amp", 0.0, 30.0, {"imports": 5.0, "training": 12.0}, 4.0)
    assert timing.overhead_phases() == pytest.approx(
        {"imports": 5.0, "fit_setup": 8.0, "other": 13.0}
    )
    assert timing.overhead_s == pytest.approx(26.0)


def test_the_legend_says_what_every_phase_covers_in_the_phases_order() -> None:
    assert tuple(pipeline_time.PHASE_LEGEND) == phases.PHASES
    pipeline = pipeline_time.collect([], _timing("compare", 1000.0, 3.0, by=None))
    legend = "\n".join(pipeline_time.markdown(pipeline)).split("Phases: ")[1]
    assert legend.startswith("*startup*: Python start and the CLI's own imports")
    assert legend.index("*training*:") < legend.index("*launch*:")


def test_a_removed_variants_stages_leave_the_pipeline_table() -> None:
    """A variant removed from params.yaml kept its timing files, and the report listed its
    `train@amp (up to date)` and `evaluate@amp (up to date)` as stages of the pipeline."""
    kept = [_timing(s, 1000.0, 3.0) for s in ("env", "train@cpu", "evaluate@cpu", "quantize@cpu")]
    gone = [_timing(s, 900.0, 3.0) for s in ("train@amp", "evaluate@amp", "quantize@amp")]
    stages = {"train@cpu", "evaluate@cpu", "quantize@cpu", "train@gpu", "evaluate@gpu"}
    assert pipeline_time.of_pipeline(kept + gone, stages) == kept


def test_a_wall_clock_set_back_between_stages_leaves_the_span_whole() -> None:
    """The date set back 2 h while train ran: Unix stamps go backwards, the boot clock does not."""
    env = StageTiming("env", 9000.0, 2.0, {}, None, "1@0", 100.0)
    train = StageTiming("train@cpu", 9003.0, 20.0, {}, 12.0, "1@0", 103.0)
    compare = StageTiming("compare", 9025.0 - 7200, 3.0, {}, None, "1@0", 125.0)
    pipeline = pipeline_time.collect([env, train], compare)
    assert pipeline.span_s == pytest.approx(28.0) and pipeline.between_stages_s == pytest.approx(
        3.0
    )


FAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), None)


@pytest.mark.skipif(FAKETIME is None, reason="needs libfaketime (apt-get install faketime)")
def test_a_stage_times_itself_truly_when_the_date_is_set_back_mid_run(tmp_path) -> None:
    """libfaketime sets the date back 2 h one second into `accelbench env`: it printed
    `done in -7196.4 s (wall)` and wrote that to its timing file. The process waits 1.5 s
    before the stage, so the date moves mid-run however fast the machine imports torch (CI's
    once ran the stage in 1.0 s, before the date moved)."""
    fake = {"LD_PRELOAD": str(FAKETIME), "FAKETIME": "-2h", "FAKETIME_START_AFTER_SECONDS": "1"}
    fake["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"  # a date set moves no monotonic clock
    params = write_params(tmp_path)
    argv = ["--params", str(params), "env", "--out", "env"]
    wait = "t = time.monotonic()\nwhile time.monotonic() - t < 1.5: pass"  # faked sleep: EINVAL
    program = f"import sys, time\n{wait}\nfrom accelbench.cli import main\nsys.argv[1:] = {argv!r}\nsys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=os.environ | fake,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    wall_s = float(re.search(r"done in (\S+) s \(wall\)", done.stderr)[1])
    timing = json.loads((tmp_path / phases.TIMINGS_DIR / "env.json").read_text())
    ending_s = timing["phases"]["ending"]  # the file is written again once the process ends
    # the printed wall is rounded to 0.1 s: 2.987 s prints as 3.0
    assert 1.5 < wall_s < 600 and wall_s - 0.05 <= timing["wall_s"] <= wall_s + ending_s + 0.5
    assert timing["started"] < time.time() - 7000  # the stamp is the (faked) date's


def test_a_thread_holding_the_gil_is_not_a_stopped_process() -> None:
    """torch.compile traces a graph holding the GIL for seconds: the heartbeat's tick waits,
    but the process runs. An H200 repro's report said "gpu epoch 1 was stopped for 0.737 s"
    of a cold compile. Only the time the process got no CPU counts (SIGSTOP: test_train)."""
    from accelbench.core.timing import Heartbeat

    heartbeat = Heartbeat()
    time.sleep(0.2)
    wall, cpu = time.perf_counter(), time.process_time()
    sum(range(100_000_000))  # one C call: the GIL held throughout (1-3 s), the tick held off
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall > 0.5, "the loop is too short to hold the tick off on this machine"
    assert heartbeat.stopped_s() <= wall - cpu + 0.3, (wall, cpu)


def _env_stage_as_the_program(tmp_path: Path, prelude: str) -> tuple[float, dict]:
    """`accelbench env` run as the program (so its process ends as a stage's does), after
    `prelude`; the wall time it said when done, and its timing file."""
    params = write_params(tmp_path)
    script = (
        f"{prelude}\nimport sys\nfrom accelbench.cli import main\n"
        f"sys.argv = ['accelbench', '--params', {str(params)!r}, 'env', '--out', 'env']\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    said_s = float(re.search(r"done in (\S+) s \(wall\)", done.stderr)[1])
    return said_s, json.loads((tmp_path / phases.TIMINGS_DIR / "env.json").read_text())


def test_a_slow_ending_is_the_stage_s_own_time(tmp_path) -> None:
    """An H200 repro's report put 21.7 s between train@gpu_dataloader's "done" and the next
    stage into DVC's time: a stage's process ending (exit handlers, workers) is its own
    `ending` phase, in its timing and its wall time."""
    slow_handler = "import atexit, time\natexit.register(time.sleep, 1.5)"
    said_s, timing = _env_stage_as_the_program(tmp_path, slow_handler)
    assert timing["phases"]["ending"] >= 1.5
    assert timing["wall_s"] >= said_s - 0.05 + 1.5  # "done in 1.5 s" is rounded


def test_an_ending_that_waits_for_a_thread_is_recorded_too(tmp_path) -> None:
    """A thread still at work when the stage is done: the process ends by the usual exit,
    which waits for it, and that wait is the stage's `ending` too."""
    thread_at_work = (
        "import threading, time\nfrom accelbench import cli\n"
        "def worker_still_at_work():  # as the stage's ending starts\n"
        "    threading.Thread(target=time.sleep, args=(1.5,)).start()\n"
        "cli.lifetime.end_compile_workers = worker_still_at_work"
    )
    _, timing = _env_stage_as_the_program(tmp_path, thread_at_work)
    assert timing["phases"]["ending"] >= 1.5
