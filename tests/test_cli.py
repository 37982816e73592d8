"""cli.py: bad params fail before any work; SIGTERM unwinds like Ctrl-C; stages by name; every
subcommand ends a user error in one line and a documented exit code, a traceback on request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from accelbench.cli import main
from helpers import REPO, cpu_train_command, mlflow_runs, write_params


@pytest.mark.slow
def test_sigterm_marks_the_run_killed_and_writes_no_outputs(
    tmp_path, prepared, mlflow_store
) -> None:
    command = cpu_train_command(tmp_path, prepared, epochs=200)
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_store}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(r.info.status == "RUNNING" for r in mlflow_runs(mlflow_store, "cpu")):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.5)
    time.sleep(2)  # inside training
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "interrupted (signal SIGTERM)" in stderr
    [run] = mlflow_runs(mlflow_store, "cpu")
    assert run.info.status == "KILLED"
    assert not (tmp_path / "cpu.pt").exists()
    assert not (tmp_path / "metrics" / "train.json").exists()


def test_ctrl_c_is_named_in_the_interrupted_line(tmp_path, monkeypatch, capsys) -> None:
    """Ctrl-C's KeyboardInterrupt has no message: the line read "interrupted ()"."""
    from accelbench.stages import env

    def pressed(*_args) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(env, "main", pressed)
    params = write_params(tmp_path)
    assert main(["--params", str(params), "env", "--out", str(tmp_path / "env")]) == 130
    assert "accelbench env: interrupted (Ctrl-C)" in capsys.readouterr().err


def test_an_error_an_interrupt_caused_is_reported_as_the_interrupt(
    tmp_path, monkeypatch, capsys
) -> None:
    """DVC killed mid-stage while quantize imported torch: the SIGTERM's KeyboardInterrupt
    left torch._dynamo half-imported, and the stage ended "unexpected AttributeError:
    partially initialized module 'torch._dynamo' ... (report it)"."""
    from accelbench import cli
    from accelbench.stages import env

    def importing(*_args) -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # lands mid-import, say
            time.sleep(5)
        except KeyboardInterrupt:
            raise AttributeError("partially initialized module 'torch._dynamo'") from None

    monkeypatch.setattr(env, "main", importing)
    monkeypatch.setattr(cli, "_interrupted_by", [])  # this process's record, for this test
    previous = signal.getsignal(signal.SIGTERM)
    params = write_params(tmp_path)
    try:
        assert main(["--params", str(params), "env", "--out", str(tmp_path / "env")]) == 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err
    assert "accelbench env: interrupted (signal SIGTERM)" in err and "unexpected" not in err
    # Ctrl-C has no handler of ours: the error is known by the interrupt it was raised in
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise AttributeError("partially initialized") from None
    except AttributeError as exc:
        monkeypatch.setattr(cli, "_interrupted_by", [])
        assert cli._interruption(exc) == "Ctrl-C"
    assert cli._interruption(ValueError("a bug")) is None


def test_params_edited_while_a_stage_ran_fail_it_naming_the_change(
    tmp_path, monkeypatch, capsys
) -> None:
    """DVC records params as a stage ends: a model trained for 6 epochs was recorded in
    dvc.lock, and reported, as trained for 3, and DVC never ran it again."""
    from accelbench.stages import train

    params = write_params(tmp_path, epochs=6)
    edits = {"epochs: 6": "epochs: 3"}

    def trains_while_the_user_edits(args, loaded, root) -> None:
        assert loaded.train.epochs == 6
        text = params.read_text()
        for old, new in edits.items():
            text = text.replace(old, new)
        params.write_text(text)

    monkeypatch.setattr(train, "main", trains_while_the_user_edits)
    argv = ["--params", str(params), "train", "cpu", "--data", "d", "--model", "m.pt"]
    argv += ["--metrics", str(tmp_path / "metrics")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"accelbench train: error: {params} changed while the stage ran (")
    assert "recipe.epochs: 6 → 3" in err and "run it again (dvc repro)" in err
    # what the stage does not read may change: cost prices, another variant, a key read only
    # to refuse a run (require_gpu: not in dvc.yaml)
    for edits in ({"kwh_usd: 0.15": "kwh_usd: 0.3"}, {"require_gpu: false": "require_gpu: true"}):
        write_params(tmp_path, epochs=6)
        assert main(argv) == 0, capsys.readouterr().err
        assert next(iter(edits.values())) in params.read_text()
    # a file made invalid mid-run is warned of: no run can have used what DVC records of it
    write_params(tmp_path, epochs=6)
    edits = {"kwh_usd: 0.15": "kwh_usd: -1"}
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert (
        f"accelbench train: warning: {params} changed while the stage ran and is no longer valid"
        in err
    )
    assert "cost.kwh_usd = -1" in err


@pytest.mark.parametrize("model", ["x.pth", "models", "README.md"])
def test_a_model_path_not_named_pt_is_a_usage_error(tmp_path, capsys, model) -> None:
    """It was "unexpected ValueError: x.pth: no output kind registered ... report it"."""
    params = write_params(tmp_path)
    argv = ["--params", str(params), "train", "cpu", "--data", str(tmp_path), "--model", model]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--metrics", str(tmp_path / "m")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --model: '{model}' is not a .pt file name" in err
    assert not (tmp_path / "m").exists()


def test_cli_rejects_bad_params_before_any_work(tmp_path, capsys) -> None:
    path = write_params(tmp_path, batch_size=0)
    assert main(["--params", str(path), "download", "--out", str(tmp_path / "raw")]) == 2
    assert "train.batch_size = 0" in capsys.readouterr().err
    assert not (tmp_path / "raw").exists()


def test_an_input_error_exits_2_naming_the_stage(tmp_path, fake_mnist, capsys) -> None:
    """prepare checks the raw files again: a valid gzip of something else is not MNIST."""
    mirror, _ = fake_mnist
    args = ["--params", str(REPO / "params.yaml"), "prepare", "--raw", str(mirror)]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelbench prepare: error: ")
    assert "train-images-idx3-ubyte.gz: not MNIST's content" in err
    assert not (tmp_path / "out").exists()


def _stage_as_the_program(folder, before: str) -> subprocess.CompletedProcess:
    """`accelbench download` run as the program (an input error: no params file), after
    `before`, a snippet of Python, has run in its process."""
    probe = (
        "import atexit, sys, threading, time\n"
        "from accelbench import cli\n"
        f"{before}\n"
        "sys.argv = ['accelbench', '--params', 'missing.yaml', 'download', '--out', 'raw']\n"
        "raise SystemExit(cli.main())\n"
    )
    return subprocess.run(
        [sys.executable, "-c", probe], cwd=folder, capture_output=True, text=True, timeout=60
    )


def test_a_stage_process_skips_the_teardown_but_not_its_exit_handlers(tmp_path) -> None:
    """Freeing every module's objects at exit costs 0.5-1.3 s after torch or MLflow: a stage
    skips it; its exit code, exit handlers and buffered output stay."""
    result = _stage_as_the_program(
        tmp_path,
        "class Held:\n"
        "    def __del__(self): print('teardown', flush=True)\n"
        "held = Held()  # freed by the interpreter's teardown alone\n"
        "atexit.register(lambda: print('exit handler'))\n"
        "print('buffered', end='')",
    )
    assert result.returncode == 2, result.stderr
    assert "accelbench download: error: " in result.stderr
    assert result.stdout == "bufferedexit handler\n"


def test_a_ctrl_c_once_the_stage_is_done_lets_its_ending_finish(tmp_path) -> None:
    """Ctrl-C just after "done" printed a KeyboardInterrupt traceback from the ending and cut
    its exit handlers short (exit -2); the ending is bounded, so it now waits for it."""
    result = _stage_as_the_program(
        tmp_path,
        "import os, signal\n"
        "def handler():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.3)\n"
        "    print('exit handler finished', flush=True)\n"
        "atexit.register(handler)",
    )
    assert result.returncode == 2, result.stderr  # the stage's own code (no params file)
    assert "exit handler finished" in result.stdout
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr


def test_a_stage_process_ends_idle_thread_pools_and_lets_queued_work_finish(tmp_path) -> None:
    """torch.compile leaves idle compile workers (a ThreadPoolExecutor's non-daemon threads):
    they end as at an ordinary exit, work they were given first, and the teardown is still
    skipped."""
    result = _stage_as_the_program(
        tmp_path,
        "from concurrent.futures import ThreadPoolExecutor\n"
        "class Held:\n"
        "    def __del__(self): print('teardown', flush=True)\n"
        "held = Held()\n"
        "idle = ThreadPoolExecutor(2); idle.submit(lambda: None).result()\n"
        "busy = ThreadPoolExecutor(1)\n"
        "busy.submit(lambda: (time.sleep(0.5), print('queued work done', flush=True)))",
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == "queued work done\n"  # and no teardown


def test_a_stage_process_waits_for_its_threads_still_at_work(tmp_path) -> None:
    result = _stage_as_the_program(
        tmp_path,
        "def work(): time.sleep(0.5); print('thread done', flush=True)\n"
        "threading.Thread(target=work).start()",
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == "thread done\n"


def test_the_cli_imports_no_stage_but_the_one_it_runs() -> None:
    """A stage's code is its module's imports: dvc.yaml's deps rely on it."""
    probe = (
        "import sys, accelbench.cli; "
        "print([m for m in sys.modules if m.startswith('accelbench.stages.')])"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


# --- every subcommand, given what a hostile but realistic user gives it -----------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tamper(prepared, name: str, array=None) -> None:
    """Replace a prepared file; with `array`, re-write the manifest too (a consistent but
    wrong folder), else leave it (tampered data)."""
    import json

    import numpy as np

    from accelbench.data import prepared as prepared_data

    path = prepared / name
    if array is None:
        content = bytearray(path.read_bytes())
        content[-1] ^= 0xFF
        path.write_bytes(bytes(content))
        return
    np.save(path, array)
    manifest = json.loads((prepared / prepared_data.MANIFEST).read_text())
    manifest["sha256"][name] = prepared_data._sha256_file(path)
    (prepared / prepared_data.MANIFEST).write_text(json.dumps(manifest))


def _model_of_another_shape(path) -> None:
    import torch

    from accelbench.core.results import ModelFile
    from helpers import FP32_CPU

    params = {"variant": {"name": "cpu", **FP32_CPU.model_dump()}, "train": {}}
    weights = {"conv1.weight": torch.zeros(3, 3)}
    ModelFile("cpu", "trained", None, params, weights).save(path)


def _case(name: str, tmp_path, prepared, monkeypatch) -> tuple[list[str], int, str]:
    """(arguments after --params, exit code, what the one error line must say)."""
    import numpy as np
    import torch

    params = write_params(tmp_path, {"cpu": {"device": "cpu"}}, epochs=1)
    text = tmp_path / "notes.txt"
    text.write_text("just some notes\n")
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    missing = tmp_path / "missing"
    metrics = ["--metrics", str(tmp_path / "metrics")]
    train = ["train", "cpu", "--model", str(tmp_path / "cpu.pt"), *metrics, "--quiet"]
    evaluate = ["evaluate", "--data", str(prepared), *metrics]
    match name:
        case "check: params.yaml missing":
            return ["--params", str(missing), "check"], 2, "file not found"
        case "check: params.yaml is a folder":
            return ["--params", str(tmp_path), "check"], 2, "is a folder"
        case "check: params.yaml is binary":
            text.write_bytes(b"\xff\xfe\x00\x81garbage")
            return ["--params", str(text), "check"], 2, "not a text file"
        case "check: variant name starting with '-'":
            bad = write_params(tmp_path, {"-cpu": {"device": "cpu"}})
            return ["--params", str(bad), "check"], 2, "variant name '-cpu'"
        case "check: mirror scheme download cannot use":
            raw = yaml.safe_load(params.read_text())
            raw["data"]["mirrors"] = ["ftp://example.com/mnist/"]
            params.write_text(yaml.safe_dump(raw))
            return ["--params", str(params), "check"], 2, "unsupported scheme 'ftp'"
        case "runs: tracking server unreachable":
            monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
            monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
            return ["--params", str(params), "runs"], 1, "cannot read MLflow tracking at http"
        case "env: --out is a file":
            return ["--params", str(params), "env", "--out", str(text)], 2, str(text)
        case "download: no mirror has the files":
            monkeypatch.delenv("ACCELBENCH_MNIST_MIRROR", raising=False)
            raw = yaml.safe_load(params.read_text())
            raw["data"]["mirrors"] = [str(tmp_path / "empty-mirror")]
            params.write_text(yaml.safe_dump(raw))
            out = ["--out", str(tmp_path / "raw")]
            return ["--params", str(params), "download", *out], 1, "could not get a verified copy"
        case "download: --out inside a file":
            out = ["--out", str(text / "raw")]
            return ["--params", str(params), "download", *out], 2, str(text)
        case "prepare: --raw missing":
            args = ["prepare", "--raw", str(missing), "--out", str(tmp_path / "p")]
            return ["--params", str(params), *args], 2, "missing; run `accelbench download`"
        case "prepare: --raw holds text, not gzip":
            for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
                (missing / f"{stem}.gz").parent.mkdir(exist_ok=True)
                (missing / f"{stem}.gz").write_text("not gzip\n")
            args = ["prepare", "--raw", str(missing), "--out", str(tmp_path / "p")]
            return ["--params", str(params), *args], 2, "not a complete gzip file"
        case "train: --data missing":
            return ["--params", str(params), *train, "--data", str(missing)], 2, "no such folder"
        case "train: --data is a text file":
            return ["--params", str(params), *train, "--data", str(text)], 2, "not a folder"
        case "train: unknown variant":
            args = [*train, "--data", str(prepared)]
            args[1] = "tpu"
            return ["--params", str(params), *args], 2, "unknown variant 'tpu'"
        case "train: prepared images with a flipped byte":
            _tamper(prepared, "train_images.npy")
            args = [*train, "--data", str(prepared)]
            return ["--params", str(params), *args], 2, "train_images.npy: changed since prepare"
        case "train: a label of 200":
            labels = np.load(prepared / "train_labels.npy")
            labels[7] = 200
            _tamper(prepared, "train_labels.npy", labels)
            args = [*train, "--data", str(prepared)]
            return ["--params", str(params), *args], 2, "label 200 outside 0..9"
        case "train: images of the wrong shape":
            _tamper(prepared, "train_images.npy", np.zeros((512, 28, 27), np.uint8))
            args = [*train, "--data", str(prepared)]
            return ["--params", str(params), *args], 2, "expected uint8 (n, 28, 28)"
        case "evaluate: model missing":
            args = [*evaluate, "--model", str(missing)]
            return ["--params", str(params), *args], 2, "does not exist"
        case "evaluate: model is a text file":
            args = [*evaluate, "--model", str(text)]
            return ["--params", str(params), *args], 2, "not a model file written by"
        case "evaluate: model is empty":
            args = [*evaluate, "--model", str(empty)]
            return ["--params", str(params), *args], 2, "not a model file written by"
        case "evaluate: model is another structure":
            torch.save([1, 2, 3], empty)
            args = [*evaluate, "--model", str(empty)]
            return ["--params", str(params), *args], 2, "(another structure)"
        case "evaluate: model of another shape":
            _model_of_another_shape(empty)
            args = [*evaluate, "--model", str(empty)]
            return ["--params", str(params), *args], 2, "weights do not fit accelbench's model"
        case "quantize: model is a text file":
            args = ["quantize", "--data", str(prepared), *metrics, "--model", str(text)]
            return ["--params", str(params), *args], 2, "not a model file written by"
        case "quantize: model of another shape":
            _model_of_another_shape(empty)
            args = ["quantize", "--data", str(prepared), *metrics, "--model", str(empty)]
            return ["--params", str(params), *args], 2, "weights do not fit accelbench's model"
        case "check: a dataset accelbench does not know":
            raw = yaml.safe_load(params.read_text())
            raw["data"]["dataset"] = "imagenet"
            params.write_text(yaml.safe_dump(raw))
            return ["--params", str(params), "check"], 2, "data.dataset = 'imagenet'"
        case "prepare: no CIFAR-10 archive":
            raw = yaml.safe_load(params.read_text())
            raw["data"]["dataset"] = "cifar10"
            params.write_text(yaml.safe_dump(raw))
            args = ["prepare", "--raw", str(tmp_path), "--out", str(tmp_path / "p")]
            return ["--params", str(params), *args], 2, "cifar-10-python.tar.gz: missing"
        case "compare: empty metrics folder":
            (tmp_path / "env").mkdir()
            for device in ("cpu", "cuda"):
                (tmp_path / "env" / f"{device}.json").write_text("{}")
            (tmp_path / "metrics").mkdir()
            args = ["compare", "--env", str(tmp_path / "env"), *metrics, "--out", str(tmp_path)]
            return ["--params", str(params), *args], 2, "train.json: missing; run `dvc repro`"
        case "compare: env folder missing":
            args = ["compare", "--env", str(missing), *metrics, "--out", str(tmp_path)]
            return ["--params", str(params), *args], 2, "cpu.json: missing; run `accelbench env"
    raise AssertionError(name)


CASES = [
    "check: params.yaml missing",
    "check: params.yaml is a folder",
    "check: params.yaml is binary",
    "check: variant name starting with '-'",
    "check: mirror scheme download cannot use",
    "runs: tracking server unreachable",
    "env: --out is a file",
    "download: no mirror has the files",
    "download: --out inside a file",
    "prepare: --raw missing",
    "prepare: --raw holds text, not gzip",
    "train: --data missing",
    "train: --data is a text file",
    "train: unknown variant",
    "train: prepared images with a flipped byte",
    "train: a label of 200",
    "train: images of the wrong shape",
    "evaluate: model missing",
    "evaluate: model is a text file",
    "evaluate: model is empty",
    "evaluate: model is another structure",
    "evaluate: model of another shape",
    "quantize: model is a text file",
    "quantize: model of another shape",
    "check: a dataset accelbench does not know",
    "prepare: no CIFAR-10 archive",
    "compare: empty metrics folder",
    "compare: env folder missing",
]


def test_the_walk_covers_every_subcommand_but_doctor() -> None:
    """doctor takes no input; its exit codes are tested in test_doctor.py."""
    from accelbench.cli import STAGES

    walked = {case.split(":")[0] for case in CASES}
    assert walked == {*STAGES, "check", "runs"}


@pytest.mark.parametrize("name", CASES)
def test_a_user_error_is_one_line_and_a_documented_exit_code(
    name, tmp_path, prepared, mlflow_store, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ACCELBENCH_DEBUG", raising=False)
    argv, code, fragment = _case(name, tmp_path, prepared, monkeypatch)
    capsys.readouterr()
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    stage = argv[2]
    [error] = [line for line in err.splitlines() if line.startswith("accelbench ")]
    assert error.startswith(f"accelbench {stage}: error: "), err
    assert fragment in error, err
    assert err.splitlines()[-1] == error  # the error is the last thing said, on one line


def test_a_full_disk_is_named_not_reported_as_a_bug(tmp_path, monkeypatch, capsys) -> None:
    """A write to a full disk raises an OSError without a path (compare's report); it read
    "unexpected OSError: [Errno 28] ... (and report it)"."""
    import errno

    from accelbench.stages import env

    def full(*_args) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(env, "main", full)
    params = write_params(tmp_path)
    assert main(["--params", str(params), "env", "--out", str(tmp_path / "env")]) == 1
    err = capsys.readouterr().err
    assert "accelbench env: error: No space left on device (free some space" in err
    assert "unexpected" not in err and "report it" not in err


@pytest.mark.slow
def test_the_traceback_comes_only_on_request(tmp_path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model\n")
    params = write_params(tmp_path, {"cpu": {"device": "cpu"}})
    args = [sys.executable, "-m", "accelbench.cli", "--params", str(params)]
    stage = ["evaluate", "--model", str(notes), "--data", str(tmp_path), "--metrics", "m"]
    env = {k: v for k, v in os.environ.items() if k != "ACCELBENCH_DEBUG"}
    plain = subprocess.run([*args, *stage], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines() == [
        f"accelbench evaluate: error: {notes}: not a model file written by `accelbench train` "
        + plain.stderr.split("accelbench train` ", 1)[1].strip()
    ]
    debug = subprocess.run(
        [*args, "--debug", *stage], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    by_env = subprocess.run(
        [*args, *stage],
        capture_output=True,
        text=True,
        env={**env, "ACCELBENCH_DEBUG": "1"},
        cwd=tmp_path,
    )
    assert by_env.returncode == 2 and "Traceback" in by_env.stderr


@pytest.mark.parametrize("command", [["check"], pytest.param(["runs"], marks=pytest.mark.slow)])
def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path, command) -> None:
    """`accelbench runs | head -2` ended "error: unexpected BrokenPipeError ... report it"
    (exit 1). A command whose reader has gone now stops without a word, with the exit code a
    shell gives a writer killed by SIGPIPE, as `git log | head` does."""
    write_params(tmp_path)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the answer is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "accelbench.cli", *command],
            cwd=tmp_path, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
            env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"},  # no store
        )  # fmt: skip
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def _limited(limit_mib: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit_mib << 20, limit_mib << 20))


@pytest.mark.parametrize(
    ("stage", "limit_mib", "said"),
    [
        ("prepare", 60, "out of memory: this process may map only 60 MiB (ulimit -v)"),
        ("prepare", 120, "out of memory: this process may map only 120 MiB (ulimit -v)"),
        ("train", 1100, "out of memory or threads (ImportError: libtorch_cpu.so: failed to map"),
    ],
)
def test_too_little_memory_is_named_not_reported_as_a_bug(
    tmp_path, prepared, stage, limit_mib, said
) -> None:
    """Under `ulimit -v` prepare said "unexpected ImportError … report it" (60 MiB), or
    OpenBLAS ended it with a line of its own (120 MiB); train could not import torch."""
    before = {p: p.read_bytes() for p in prepared.rglob("*") if p.is_file()}
    args = {
        "prepare": ["--raw", str(tmp_path / "mirror"), "--out", str(prepared)],
        "train": ["cpu", "--data", str(prepared), "--model", str(tmp_path / "cpu.pt"),
                  "--metrics", str(tmp_path / "metrics")],
    }[stage]  # fmt: skip
    params = write_params(tmp_path, {"cpu": {"device": "cpu"}})
    command = [sys.executable, "-m", "accelbench.cli", "--params", str(params), stage, *args]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, preexec_fn=lambda: _limited(limit_mib)
    )
    [line] = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 1 and line.startswith(f"accelbench {stage}: error: {said}"), line
    assert "Traceback" not in done.stderr and "report it" not in line
    assert {p: p.read_bytes() for p in prepared.rglob("*") if p.is_file()} == before  # kept


def test_a_malformed_tracking_uri_is_named_without_its_password(tmp_path) -> None:
    """It was "unexpected ValueError: Invalid IPv6 URL … report it"."""
    env = os.environ | {"MLFLOW_TRACKING_URI": "http://ana:s3cret@[::1"}
    command = [sys.executable, "-m", "accelbench.cli", "runs"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "accelbench runs: error: MLFLOW_TRACKING_URI is not a valid URI (Invalid IPv6 URL): set "
        "it to a tracking server (http://host:5000) or store (sqlite:////path/mlflow.db), or "
        "unset it for this checkout's own store"
    ]
