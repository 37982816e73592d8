#!/usr/bin/env python3
"""Build a wheelhouse (a folder of wheels) for an air-gapped host with another Python.

The target host (by default the lent GPU machine: CPython 3.12, Linux x86_64, no network)
already has torch, numpy, pandas, scipy, ... installed. This tool takes the pinned lock,
drops every distribution the host already has (``--skip-file``) or does not need
(``--exclude``), and puts one wheel per remaining pin into ``--out``:

* a binary wheel downloaded for the *target* interpreter and platform
  (``pip download --only-binary=:all: --no-deps --python-version X --implementation cp
  --platform manylinux_2_N_x86_64 ...``), or, where none exists,
* a wheel built here from the pin's source distribution (``pip wheel --no-deps``). Only
  pure-Python results (``*-none-any.whl``) are accepted: a compiled one would be built for
  *this* interpreter and platform, not the target's, so the tool stops and says so.

It then prints a table (name, version, MiB, downloaded/built), writes
``<out>/requirements.txt`` with the pins it holds and fails if the total exceeds
``--max-mib``. ``--out`` is only replaced when everything succeeded.

On the target host (see README)::

    python3 -m pip install --no-index --no-deps --find-links .whl -r .whl/requirements.txt

``--no-deps`` matters: the host's own packages are other versions than the lock's, and pip's
resolver refuses some of them (on nvidia-h200, certifi 2026.7.22 is older than databricks-sdk
asks for) although nothing the project imports is affected; ``pip check`` lists such mismatches.

Standard library only, so it runs with any Python >= 3.9 that has pip.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LOCK = ROOT / "requirements.lock"
DEFAULT_SKIP_FILE = ROOT / "tools" / "host-packages" / "nvidia-h200.txt"
DEFAULT_OUT = ROOT / ".whl"
# Pins in the lock that the pipeline never needs on the target host: the development tools
# (pyproject's `dev` extra, read below, but pytest: the GPU tests run there), and the full
# `mlflow` distribution (its bundled web UI, ~11 MiB) with what only its server needs.
# `mlflow-skinny` (kept) holds the whole Python API, sqlite store and alembic migrations
# included: start_run, log_metrics and mlflow.pytorch.log_model against a sqlite:/// URI were
# checked with exactly this set (pip check clean). Pass --exclude ruff to carry full mlflow.
MLFLOW_SERVER_ONLY = (
    "mlflow,flask,flask-cors,gunicorn,graphene,graphql-core,graphql-relay,docker,huey,skops"
)
HOST_RUNS = ("pytest",)


def dev_tools(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The `dev` extra's distributions a GPU host does not run (playwright alone is 51 MiB)."""
    import tomllib

    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["dev"]
    names = [re.split(r"[=<>!~;\[ ]", requirement, maxsplit=1)[0] for requirement in extra]
    return [name for name in names if normalize_name(name) not in HOST_RUNS]


def default_exclude() -> str:
    return ",".join([*dev_tools(), MLFLOW_SERVER_ONLY])


# glibc versions whose manylinux tags the target accepts (its glibc is 2.39 or newer; pip
# matches tags exactly, so every manylinux_2_N in between is listed, plus the legacy aliases).
MANYLINUX_MIN_MINOR = 17
MANYLINUX_MAX_MINOR = 39
LEGACY_PLATFORMS = ("manylinux2014", "manylinux2010", "manylinux1")
MANIFEST = "requirements.txt"

_PIN_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
    r"\s*(?:\[[^\]]*\])?"
    r"\s*===?\s*(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$"
)
_WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


class WheelhouseError(Exception):
    """A failure with a message meant for the user (printed without a traceback)."""


@dataclass(frozen=True)
class Pin:
    name: str  # as spelled in the lock
    version: str

    @property
    def key(self) -> str:
        return normalize_name(self.name)

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Wheel:
    pin: Pin
    path: Path
    source: str  # "downloaded" or "built"

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def normalize_name(name: str) -> str:
    """PEP 503 normalized form: lower case, runs of '-', '_' and '.' become one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, source: str = "lock") -> list[Pin]:
    """Parse a pinned requirements file (``name==version`` per line).

    Comments, blank lines, option lines (``--hash``, ``-r``, ...) and backslash continuations
    are handled; extras are dropped. Anything that is not an exact pin (a range, a URL, an
    environment marker) is an error: a wheelhouse must hold exactly what the lock says.
    """
    pins: dict[str, Pin] = {}
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not buf:
            start = lineno
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append((start, buf + line))
        buf = ""
    if buf:
        logical.append((start, buf))
    for lineno, line in logical:
        # Drop trailing per-requirement options such as --hash=sha256:...
        req = re.split(r"\s+--?[A-Za-z]", " " + line, maxsplit=1)[0].strip()
        if not req:
            continue  # blank, comment or option-only line
        if ";" in req:
            raise WheelhouseError(
                f"{source}:{lineno}: environment markers are not supported: {req!r}"
            )
        m = _PIN_RE.match(req)
        if not m:
            raise WheelhouseError(f"{source}:{lineno}: not an exact pin 'name==version': {req!r}")
        pin = Pin(m["name"], m["version"])
        if pin.key in pins:
            raise WheelhouseError(
                f"{source}:{lineno}: {pin.name} is pinned twice "
                f"({pins[pin.key].version} and {pin.version})"
            )
        pins[pin.key] = pin
    return list(pins.values())


def parse_name_list(text: str) -> set[str]:
    """Normalized distribution names, one per line; '#' comments and blank lines ignored.

    A line may carry a version or specifier (``numpy 2.5.2``, ``numpy==2.5.2``): only the
    name counts.
    """
    names = set()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.add(normalize_name(re.split(r"[\s=<>!~;\[]", line, maxsplit=1)[0]))
    return names


def select_pins(
    pins: Iterable[Pin], skip: Iterable[str], exclude: Iterable[str] = ()
) -> tuple[list[Pin], list[Pin], list[Pin]]:
    """Split pins into (kept, on the host already, excluded); names compared per PEP 503."""
    skip_keys = {normalize_name(n) for n in skip}
    exclude_keys = {normalize_name(n) for n in exclude}
    kept, skipped, excluded = [], [], []
    for pin in pins:
        if pin.key in exclude_keys:
            excluded.append(pin)
        elif pin.key in skip_keys:
            skipped.append(pin)
        else:
            kept.append(pin)
    return kept, skipped, excluded


def platform_tags(
    arch: str = "x86_64", low: int = MANYLINUX_MIN_MINOR, high: int = MANYLINUX_MAX_MINOR
) -> list[str]:
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(high, low - 1, -1)]
    return tags + [f"{legacy}_{arch}" for legacy in LEGACY_PLATFORMS]


def parse_wheel_filename(filename: str) -> dict[str, str]:
    m = _WHEEL_RE.match(filename)
    if not m:
        raise WheelhouseError(f"not a wheel file name: {filename}")
    return m.groupdict()


def is_pure_wheel(filename: str) -> bool:
    info = parse_wheel_filename(filename)
    return info["abi"] == "none" and info["plat"] == "any"


@dataclass(frozen=True)
class Options:
    python_version: str
    platforms: Sequence[str]
    find_links: Sequence[str] = ()
    no_index: bool = False
    build_isolation: bool = True
    python: str = sys.executable

    def index_args(self) -> list[str]:
        args = [arg for link in self.find_links for arg in ("--find-links", link)]
        return args + (["--no-index"] if self.no_index else [])


def _pip(python: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return subprocess.run(
        [python, "-m", "pip", *args], capture_output=True, text=True, env=env, check=False
    )


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 12) -> str:
    out = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    # pip warns about every config location it cannot read; those are noise here.
    out = [ln for ln in out if "is ignored: it is neither a file nor a directory" not in ln]
    return "\n".join("    " + ln for ln in out[-lines:])


def _single_wheel(folder: Path, pin: Pin) -> Path:
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise WheelhouseError(f"{pin}: expected one wheel, pip left {[w.name for w in wheels]}")
    info = parse_wheel_filename(wheels[0].name)
    if normalize_name(info["name"]) != pin.key:
        raise WheelhouseError(f"{pin}: pip produced an unexpected wheel {wheels[0].name}")
    return wheels[0]


def download_wheel(pin: Pin, dest: Path, opts: Options) -> tuple[Path | None, str]:
    """Download the target's binary wheel for pin into dest; (None, pip's output) if none."""
    args = ["download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    args += ["--python-version", opts.python_version, "--implementation", "cp"]
    args += [arg for plat in opts.platforms for arg in ("--platform", plat)]
    args += [*opts.index_args(), "--dest", str(dest), str(pin)]
    proc = _pip(opts.python, args)
    if proc.returncode != 0:
        return None, _tail(proc)
    return _single_wheel(dest, pin), ""


def build_wheel(pin: Pin, dest: Path, opts: Options) -> Path:
    """Build pin's sdist into a wheel with the local pip; only pure-Python results pass."""
    args = ["wheel", "--no-deps", "--no-binary", pin.name, "--wheel-dir", str(dest)]
    if not opts.build_isolation:
        args.append("--no-build-isolation")
    args += [*opts.index_args(), str(pin)]
    proc = _pip(opts.python, args)
    if proc.returncode != 0:
        raise WheelhouseError(
            f"{pin}: no binary wheel for CPython {opts.python_version} on the target "
            f"platforms, and building one from its sdist failed:\n"
            f"{_tail(proc)}"
        )
    wheel = _single_wheel(dest, pin)
    if not is_pure_wheel(wheel.name):
        raise WheelhouseError(
            f"{pin}: has no binary wheel for CPython {opts.python_version}, and its sdist is "
            f"not pure Python (building here gave {wheel.name}, which is tied to this "
            f"interpreter, Python {sys.version_info.major}.{sys.version_info.minor}). Build it "
            f"on a Linux x86_64 machine with CPython {opts.python_version} "
            f"('python -m pip wheel --no-deps {pin}') and put the wheel in the wheelhouse, "
            f"or pick a version in the lock that has a wheel."
        )
    return wheel


def fetch_one(pin: Pin, workdir: Path, opts: Options) -> Wheel:
    dl_dir = workdir / f"dl-{pin.key}"
    dl_dir.mkdir()
    path, _why = download_wheel(pin, dl_dir, opts)
    if path is not None:
        return Wheel(pin, path, "downloaded")
    build_dir = workdir / f"build-{pin.key}"
    build_dir.mkdir()
    return Wheel(pin, build_wheel(pin, build_dir, opts), "built")


def fetch_all(pins: Sequence[Pin], workdir: Path, opts: Options, jobs: int) -> list[Wheel]:
    errors: list[str] = []
    wheels: list[Wheel] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [(pin, pool.submit(fetch_one, pin, workdir, opts)) for pin in pins]
        for pin, fut in futures:
            try:
                wheels.append(fut.result())
            except WheelhouseError as exc:
                errors.append(str(exc))
            except OSError as exc:  # pragma: no cover - disk trouble
                errors.append(f"{pin}: {exc}")
    if errors:
        raise WheelhouseError(f"{len(errors)} of {len(pins)} pins failed:\n" + "\n".join(errors))
    return wheels


def mib(n_bytes: int) -> float:
    return n_bytes / (1024 * 1024)


def summary_table(wheels: Sequence[Wheel]) -> str:
    rows = sorted(wheels, key=lambda w: w.pin.key)
    width = max([len("name")] + [len(w.pin.name) for w in rows])
    vwidth = max([len("version")] + [len(w.pin.version) for w in rows])
    lines = [f"{'name':<{width}}  {'version':<{vwidth}}  {'MiB':>7}  source"]
    lines.append("-" * len(lines[0]))
    for w in rows:
        lines.append(
            f"{w.pin.name:<{width}}  {w.pin.version:<{vwidth}}  {mib(w.size):7.2f}  {w.source}"
        )
    total = sum(w.size for w in rows)
    lines.append("-" * len(lines[0]))
    lines.append(f"{'total':<{width}}  {len(rows):<{vwidth}}  {mib(total):7.2f}")
    return "\n".join(lines)


def check_size(wheels: Sequence[Wheel], max_mib: float) -> None:
    total = sum(w.size for w in wheels)
    if mib(total) > max_mib:
        biggest = sorted(wheels, key=lambda w: w.size, reverse=True)[:8]
        names = "\n".join(f"    {mib(w.size):7.2f} MiB  {w.path.name}" for w in biggest)
        raise WheelhouseError(
            f"wheelhouse is {mib(total):.2f} MiB, over --max-mib {max_mib:g}. Biggest wheels:\n"
            f"{names}\nSkip what the host has (--skip-file), drop what it does not need "
            f"(--exclude), or raise --max-mib."
        )


def write_manifest(folder: Path, wheels: Sequence[Wheel], header: Sequence[str]) -> Path:
    lines = [f"# {h}" for h in header]
    lines += [str(w.pin) for w in sorted(wheels, key=lambda w: w.pin.key)]
    path = folder / MANIFEST
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def install_into(out: Path, wheels: Sequence[Wheel], header: Sequence[str]) -> None:
    """Replace out's wheels and manifest with the new ones (other files are left alone)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.whl"), out / MANIFEST]:
        if old.exists():
            old.unlink()
    for w in wheels:
        shutil.copy2(w.path, out / w.path.name)
    write_manifest(out, wheels, header)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=(
            "Download (or build, for pure-Python sdists) one wheel per pin of the lock for a "
            "target CPython on Linux x86_64, leaving out what the target host already has."
        ),
    )
    p.add_argument("--python-version", default="3.12", help="target CPython X.Y (default 3.12)")
    p.add_argument("--lock", type=Path, default=DEFAULT_LOCK, help="pinned requirements file")
    p.add_argument(
        "--skip-file",
        type=Path,
        default=DEFAULT_SKIP_FILE,
        help="distribution names the target host already has, one per line",
    )
    p.add_argument(
        "--exclude",
        default=default_exclude(),
        help="comma-separated pins not needed on the host (default: the dev tools but pytest, "
        "and the full mlflow with its server-only deps, mlflow-skinny stays; '' keeps every pin)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="wheelhouse folder")
    p.add_argument("--max-mib", type=float, default=60.0, help="fail above this total size")
    p.add_argument(
        "--platform",
        action="append",
        dest="platforms",
        help="target platform tag, repeatable (default manylinux_2_39..2_17, manylinux2014, "
        "manylinux2010, manylinux1, all x86_64)",
    )
    p.add_argument("--find-links", action="append", default=[], help="passed to pip (repeatable)")
    p.add_argument("--no-index", action="store_true", help="passed to pip: no package index")
    p.add_argument(
        "--no-build-isolation",
        action="store_true",
        help="build sdists with the build tools of this interpreter (needed with --no-index)",
    )
    p.add_argument("--jobs", type=int, default=8, help="parallel pip processes (default 8)")
    return p


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        raise WheelhouseError(f"--python-version must look like 3.12, not {args.python_version!r}")
    for label, path in (("--lock", args.lock), ("--skip-file", args.skip_file)):
        if not path.is_file():
            raise WheelhouseError(f"{label} {path}: no such file")
    pins = parse_lock(args.lock.read_text(encoding="utf-8"), str(args.lock))
    skip = parse_name_list(args.skip_file.read_text(encoding="utf-8"))
    exclude = [n.strip() for n in args.exclude.split(",") if n.strip()]
    kept, skipped, excluded = select_pins(pins, skip, exclude)
    print(
        f"{args.lock}: {len(pins)} pins; {len(skipped)} already on the host "
        f"({args.skip_file}), {len(excluded)} excluded, {len(kept)} to fetch "
        f"for CPython {args.python_version}"
    )
    if excluded:
        print("excluded: " + ", ".join(str(p) for p in excluded))
    if not kept:
        raise WheelhouseError("nothing left to fetch: every pin is skipped or excluded")
    opts = Options(
        python_version=args.python_version,
        platforms=args.platforms or platform_tags(),
        find_links=[str(Path(x).resolve()) if Path(x).exists() else x for x in args.find_links],
        no_index=args.no_index,
        build_isolation=not args.no_build_isolation,
    )
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        wheels = fetch_all(kept, Path(tmp), opts, args.jobs)
        print(summary_table(wheels))
        check_size(wheels, args.max_mib)
        header = [
            f"Wheelhouse for CPython {args.python_version} x86_64, made by tools/wheelhouse.py "
            f"from {args.lock.name}; {len(skipped)} pins on the host left out "
            f"({args.skip_file.name}), excluded: {', '.join(exclude) or 'none'}.",
            "Install: python3 -m pip install --no-index --no-deps --find-links <this folder> "
            f"-r <this folder>/{MANIFEST}",
        ]
        install_into(args.out, wheels, header)
    built = [w for w in wheels if w.source == "built"]
    if built:
        print("built here from sdists: " + ", ".join(str(w.pin) for w in built))
    print(f"wrote {len(wheels)} wheels and {MANIFEST} to {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except WheelhouseError as exc:
        print(f"wheelhouse: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
