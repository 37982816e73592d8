"""`accelbench <stage>`: parse arguments, validate params.yaml, call the stage's module.
Every stage validates the whole params.yaml first, so bad input fails `dvc repro` at its
first stage; the stage then reads only its own keys (its module's `select`).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from accelbench.core import phases
from accelbench.core.console import (
    DEBUG_ENV,
    EXIT_INTERRUPTED,
    EXIT_READER_GONE,
    InputError,
    StageError,
    error_message,
    log,
    print_error,
    print_traceback,
    redact_tracebacks,
)
from accelbench.core.params import Params, differences, load_params
from accelbench.system import lifetime

# The stages dvc.yaml runs, with their `--help` lines. Only the stage being run is imported (its
# arguments too): editing one stage's command line re-runs no other stage.
STAGES = {
    "env": "record the machine's hardware and software facts",
    "download": "fetch and verify the dataset's files",
    "prepare": "decode and validate the raw files into arrays",
    "train": "train one variant",
    "evaluate": "evaluate one trained variant",
    "quantize": "one trained variant on the CPU: fp32 next to int8 (dynamic, static)",
    "compare": "write the comparison report",
}


# numpy's OpenBLAS reserves its buffers at import and, where it cannot, ends the process
# from C with a line of its own: a smaller address space is refused before any import.
MIN_ADDRESS_SPACE = 1 << 30


def _check_environment(stage: str) -> None:
    """The process's limits and $MLFLOW_TRACKING_URI (never echoed: it may hold a password)."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if stage in STAGES and limit != resource.RLIM_INFINITY and limit < MIN_ADDRESS_SPACE:
        raise StageError(
            f"out of memory: this process may map only {limit >> 20} MiB (ulimit -v); a stage "
            f"needs at least {MIN_ADDRESS_SPACE >> 20} MiB, a training stage several GiB "
            "(torch's libraries): raise the limit (ulimit -v unlimited) and run again"
        )
    try:
        _ = urlsplit(os.environ.get("MLFLOW_TRACKING_URI", "")).port  # raises where malformed
    except ValueError as exc:
        raise InputError(
            f"MLFLOW_TRACKING_URI is not a valid URI ({exc}): set it to a tracking server "
            "(http://host:5000) or store (sqlite:////path/mlflow.db), or unset it for this "
            "checkout's own store"
        ) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accelbench",
        description="The pipeline's stages (dvc.yaml calls them; run them all with `dvc repro`) "
        "and tools: check, runs, doctor, ui, server. `accelbench STAGE --help` lists a stage's "
        "arguments.",
        epilog="Exit codes: 0 done, 2 usage or input error (fix the argument or file named), "
        "1 failure (the input was fine: a mirror, the tracking server, memory, a bug), "
        "130 interrupted, 141 the reader of the output went away (doctor adds 3: CPU only). "
        "Errors are one line; --debug (or ACCELBENCH_DEBUG=1) adds the traceback.",
    )
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error, too")
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")

    sub.add_parser("check", help="validate params.yaml and exit")
    sub.add_parser("runs", help="the newest pipeline run and its variant runs in MLflow")
    doctor = sub.add_parser(
        "doctor",
        help="check that the NVIDIA driver, the GPU and the torch build fit together",
        description="Exit codes: 0 GPU ready, 3 CPU only (nothing required a GPU), 1 problems.",
    )
    doctor.add_argument("--require-gpu", action="store_true", help="a missing GPU is a problem")
    launchers = {
        "ui": "the MLflow UI over this checkout's store (make ui)",
        "server": "a team's MLflow server on PostgreSQL (docs/teams.md)",
    }
    for name, help_line in (launchers | STAGES).items():
        # Its arguments, --help included, are left to its module's own parser.
        sub.add_parser(name, help=help_line, add_help=False)
    return parser


def _check_params_unchanged(stage: Any, args: argparse.Namespace, params: Params) -> None:
    """DVC records a stage's params as they are when it ends: an edit of params.yaml while the
    stage ran would be recorded beside outputs made with the old values. Fail instead, naming
    what changed (its module's CHECKS, not in dvc.yaml, may change). A file no longer valid is
    only warned of: DVC records no value a run used, so the stage runs again once mended."""
    try:
        now = load_params(args.params)
    except InputError as exc:
        log(
            f"accelbench {args.stage}: warning: {args.params} changed while the stage ran and "
            f"is no longer valid ({exc}); mend it before the next run"
        )
        return
    checks = {key.rsplit(".", 1)[-1] for key in getattr(stage, "CHECKS", ())}
    extra = (args.variant,) if args.stage == "train" else ()  # what its `select` reads
    before, after = stage.select(params, *extra), stage.select(now, *extra)
    changed = [c for c in differences(before, after) if c.split(":", 1)[0] not in checks]
    if changed:
        shown = "; ".join(changed[:3]) + (f"; {len(changed) - 3} more" if len(changed) > 3 else "")
        raise InputError(
            f"{args.params} changed while the stage ran ({shown}): its outputs were made with "
            "the values it started with, which DVC would not record; run it again (dvc repro)"
        )


def _stage_arguments(name: str, stage_args: list[str], into: argparse.Namespace) -> Any:
    """Import the stage's module and parse its arguments with its own parser."""
    with phases.phase("imports"):
        module = importlib.import_module(f"accelbench.stages.{name}")
    parser = argparse.ArgumentParser(prog=f"accelbench {name}", description=STAGES[name])
    module.arguments(parser)
    parser.parse_args(stage_args, namespace=into)
    return module


# The signal that interrupted this process, once one did: what follows is its consequence.
_interrupted_by: list[str] = []


def _interrupt_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C: open MLflow runs are marked KILLED, temporary files removed."""

    def handler(signum: int, frame: object) -> None:
        # Once: a second SIGTERM (a launcher and a watchdog both) must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _interrupted_by.append(f"signal {signal.Signals(signum).name}")
        if lifetime.ending_with_launcher():  # DVC or torchrun gone, or stopping it: bounded
            lifetime.end_within(lifetime.STOP_LIMIT_S, EXIT_INTERRUPTED, "the stopping stage")
        raise KeyboardInterrupt(_interrupted_by[-1])

    signal.signal(signal.SIGTERM, handler)


def _interruption(exc: BaseException) -> str | None:
    """What interrupted the process, where `exc` came of it: a SIGTERM before it, or a Ctrl-C
    it was raised while handling (one inside an import can surface as an AttributeError)."""
    if _interrupted_by:
        return _interrupted_by[0]
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return str(cause) or "Ctrl-C"
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _persistent_compile_cache(root: Path) -> None:
    """torch.compile's caches and the CUDA driver's JIT cache in the checkout, not in /tmp: a
    second run compiles nothing, and the portable compile cache carries them
    (`training/compile_cache.py`). Set before torch is imported; a user's own setting wins."""
    cache = root / ".accelbench" / "compile-cache"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
    os.environ.setdefault("CUDA_CACHE_PATH", str(root / ".accelbench" / "cuda-jit-cache"))


def _end_process(code: int) -> NoReturn:
    """End a stage's process as the interpreter would, without its teardown (freeing torch's
    and MLflow's objects takes 0.5-1.3 s that DVC waits for): threads still at work get the
    usual exit; otherwise the exit handlers run and the process ends. That is the stage's
    `ending` phase, its timing written again last. All of it within `lifetime.ENDING_LIMIT_S`,
    Ctrl-C and SIGTERM ignored: arriving now, they would cut the exit handlers short."""
    for interrupt in (signal.SIGINT, signal.SIGTERM):
        signal.signal(interrupt, signal.SIG_IGN)
    lifetime.end_within(lifetime.ENDING_LIMIT_S, code, "the finished stage's process")
    started, recorder = time.perf_counter(), phases.RECORDER

    def ending() -> None:
        """The time since `started` as the `ending` phase; the stage's timing written again."""
        recorder.add("ending", time.perf_counter() - started)
        if recorder.root is not None:
            with contextlib.suppress(OSError):
                phases.write(recorder.root, recorder.timing())

    lifetime.end_compile_workers()
    if (futures := sys.modules.get("concurrent.futures.thread")) is not None:
        futures._python_exit()  # what threading's shutdown calls: idle workers end, busy finish
    others = (t for t in threading.enumerate() if t is not threading.main_thread())
    if any(t.is_alive() and not t.daemon for t in others):
        atexit.register(ending)  # the first handler to run, once the threads are done
        sys.exit(code)
    atexit._run_exitfuncs()
    ending()
    lifetime.end_now(code)


def _print_out(text: str, code: int = 0) -> int:
    """Print a command's answer to stdout and return `code`; where the reader has gone
    (`accelbench runs | head -3`), stop quietly with EXIT_READER_GONE, as `git log | head`."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # stdout to /dev/null: the interpreter's last flush would fail on the pipe again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_GONE
    return code


def main(argv: list[str] | None = None) -> int:
    """`accelbench`: run a stage or tool; returns the exit code. Run as the program (no
    `argv`), a stage's process ends here (`_end_process`)."""
    if argv is None:  # the program: Python's own tracebacks masked too
        redact_tracebacks()
    parser = _parser()
    args, stage_args = parser.parse_known_args(argv)
    code = _run(parser, args, stage_args, argv)
    if argv is None and args.stage in STAGES:
        _end_process(code)
    return code


def _failed(args: argparse.Namespace, exc: Exception) -> int:
    """The exit code for the error `exc`, after its one line (the traceback first on request)."""
    if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        print_traceback(exc)
    if (why := _interruption(exc)) is not None:
        print(f"accelbench {args.stage}: interrupted ({why})", file=sys.stderr)
        return EXIT_INTERRUPTED
    message, code = error_message(exc)
    print_error(f"accelbench {args.stage}", message)
    return code


def _run(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    stage_args: list[str],
    argv: list[str] | None,
) -> int:
    if args.stage in ("ui", "server"):  # need no params.yaml: launchers of MLflow's server
        return importlib.import_module(f"accelbench.system.{args.stage}").main(stage_args)
    if stage_args and args.stage not in STAGES:
        parser.error(f"unrecognized arguments: {' '.join(stage_args)}")
    _interrupt_on_sigterm()
    if args.stage in STAGES:  # no stage outlives the `dvc repro` that started it
        lifetime.end_with_launcher()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow's INFO lines would be half of a stage's output (MLFLOW_LOGGING_LEVEL=INFO shows them)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if args.stage == "doctor":  # needs no params.yaml: it runs before a checkout is set up
        doctor = importlib.import_module("accelbench.system.doctor")
        report = doctor.diagnose(doctor.gather(), require_gpu=args.require_gpu)
        return _print_out(doctor.render(report), report.exit_code)
    root = Path.cwd()
    _persistent_compile_cache(root)
    recorder = phases.RECORDER
    recorder.add("startup", recorder.elapsed_s())
    recorder.stage = args.stage
    args.argv = list(sys.argv[1:] if argv is None else argv)  # a DDP stage re-runs itself
    try:
        _check_environment(args.stage)
        # Imported by name: a stage's code is its own module's imports (dvc.yaml's deps)
        stage = _stage_arguments(args.stage, stage_args, args) if args.stage in STAGES else None
        if args.stage == "runs":  # the workspace's store, from any of its subfolders: no params
            runs = importlib.import_module("accelbench.report.runs")
            store = importlib.import_module("accelbench.system.tracking.store")
            return _print_out(runs.summary_markdown(store.workspace_root(root, args.params)))
        with phases.phase("params"):
            params = load_params(args.params)
        if args.stage == "check":
            return _print_out(f"{args.params}: valid ({', '.join(params.variants)})")
        stage.main(args, params, root)
        if "LOCAL_RANK" not in os.environ:  # a torchrun child: its launcher checks
            _check_params_unchanged(stage, args, params)
    except KeyboardInterrupt as exc:
        print(f"accelbench {args.stage}: interrupted ({str(exc) or 'Ctrl-C'})", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # every error ends in one line; the traceback only on request
        return _failed(args, exc)
    if args.stage in STAGES and "LOCAL_RANK" not in os.environ:  # not a torchrun child
        timing = recorder.timing()
        phases.write(root, timing)
        recorder.root = root  # `_end_process` adds the ending
        print(f"accelbench {timing.stage}: done in {timing.wall_s:.1f} s (wall)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
