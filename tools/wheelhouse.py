#!/usr/bin/env python3
"""Build a wheelhouse (a folder of wheels) for an air-gapped host with another Python.

The wheelhouse is uv.lock's runtime group for the target (CPython X.Y on Linux x86_64 or
aarch64) minus what the host reports having. The host's list is given explicitly with
``--host-packages FILE``: made there with ``python3 -m pip list --format=freeze`` (or a
hand-kept list such as ``tools/host-packages/nvidia-h200.txt``); names count, versions do not,
since the host's own torch, numpy, ... are the ones that run there.

1. ``uv export --frozen --no-dev --no-emit-project`` writes the runtime group with each pin's
   environment markers and hashes (``--requirements FILE`` gives such a file instead);
2. each marker is evaluated for the target (so torch's CUDA wheels travel to Linux only and the
   development tools never do), and the host's packages are dropped;
3. one wheel per remaining pin goes into ``--out``:

   * a binary wheel downloaded for the *target* interpreter and platform
     (``pip download --only-binary=:all: --no-deps --python-version X --implementation cp
     --platform manylinux_2_N_<arch> ...``), its SHA-256 checked against the lock, or, where
     none exists,
   * a wheel built here from the pin's source distribution (``pip wheel --no-deps``, the sdist's
     hash checked by pip). Only pure-Python results (``*-none-any.whl``) are accepted: a
     compiled one would be built for *this* interpreter and platform, not the target's, so the
     tool stops and says so.

It then prints a table (name, version, MiB, downloaded/built), writes
``<out>/requirements.txt`` with the pins it holds and fails if the total exceeds
``--max-mib``. ``--out`` is only replaced when everything succeeded.

On the target host (see docs/air-gapped.md)::

    python3 -m pip install --no-index --no-deps --find-links .whl -r .whl/requirements.txt

``--no-deps`` matters: the host's own packages are other versions than the lock's, and pip's
resolver refuses some of them (on nvidia-h200, certifi 2026.7.22 is older than databricks-sdk
asks for) although nothing the project imports is affected; ``pip check`` lists such mismatches.

Runs with the project's environment (``make wheelhouse`` after ``make setup``): it needs uv,
pip and ``packaging`` (the dev group has all three).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import InvalidMarker, Marker
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / ".whl"
ARCHES = ("x86_64", "aarch64")
# The lock's runtime group, as pip reads it: markers and hashes kept, the project left out.
EXPORT_ARGS = (
    "export", "--frozen", "--no-dev", "--no-emit-project", "--no-header", "--no-annotate",
    "--format", "requirements.txt",
)  # fmt: skip

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
_HASH_RE = re.compile(r"--hash[=\s]+sha256:(?P<digest>[0-9a-fA-F]{64})")
_WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


class WheelhouseError(Exception):
    """A failure with a message meant for the user (printed without a traceback); exit 1."""


class InputError(WheelhouseError):
    """Bad input, found before any work; exit 2."""


@dataclass(frozen=True)
class Pin:
    name: str  # as spelled in the requirements
    version: str
    marker: str = ""  # PEP 508 environment marker; "" = every environment
    hashes: frozenset[str] = field(default=frozenset())  # sha256 hex digests the lock allows

    @property
    def key(self) -> str:
        return normalize_name(self.name)

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"

    def requirement_line(self) -> str:
        """The pin as a requirements line pip checks the hashes of."""
        return " ".join([str(self), *(f"--hash=sha256:{h}" for h in sorted(self.hashes))])


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


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) per requirement: comments dropped, continuations joined."""
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
    return logical


def parse_requirements(text: str, source: str = "requirements") -> list[Pin]:
    """Parse pinned requirements as ``uv export`` writes them.

    One ``name==version`` per requirement, optionally with ``; marker`` and ``--hash=sha256:``
    options (on continuation lines or not); comments and blank lines are skipped, extras
    dropped. Anything that is not an exact pin (a range, a URL) or a marker that does not parse
    is an error: a wheelhouse must hold exactly what the lock says.
    """
    pins: list[Pin] = []
    for lineno, line in _logical_lines(text):
        hashes = frozenset(m["digest"].lower() for m in _HASH_RE.finditer(line))
        # Drop trailing per-requirement options such as --hash=sha256:...
        req = re.split(r"\s+--?[A-Za-z]", " " + line, maxsplit=1)[0].strip()
        if not req:
            continue  # blank, comment or option-only line
        req, _, marker = (part.strip() for part in req.partition(";"))
        if marker:
            try:
                Marker(marker)
            except InvalidMarker as exc:
                raise WheelhouseError(f"{source}:{lineno}: bad environment marker: {exc}") from exc
        m = _PIN_RE.match(req)
        if not m:
            raise WheelhouseError(f"{source}:{lineno}: not an exact pin 'name==version': {req!r}")
        pins.append(Pin(m["name"], m["version"], marker, hashes))
    return pins


def target_environment(python_version: str, arch: str = "x86_64") -> dict[str, str]:
    """PEP 508 marker values of a CPython X.Y host on Linux (X.Y.0 for the full version)."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python_version}.0",
        "os_name": "posix",
        "platform_machine": arch,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": f"{python_version}.0",
        "python_version": python_version,
        "sys_platform": "linux",
    }


def for_target(pins: Iterable[Pin], environment: dict[str, str], source: str = "") -> list[Pin]:
    """The pins whose markers hold on the target; one pin per name, or an error."""
    chosen: dict[str, Pin] = {}
    for pin in pins:
        if pin.marker and not Marker(pin.marker).evaluate(environment):
            continue
        if pin.key in chosen:
            raise WheelhouseError(
                f"{source or 'requirements'}: {pin.name} is pinned twice for the target "
                f"({chosen[pin.key].version} and {pin.version})"
            )
        chosen[pin.key] = pin
    return list(chosen.values())


def parse_name_list(text: str) -> set[str]:
    """Normalized distribution names, one per line; '#' comments and blank lines ignored.

    A line may carry a version or specifier (``numpy 2.5.2``, ``numpy==2.5.2`` as
    ``pip list --format=freeze`` writes it): only the name counts.
    """
    names = set()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.add(normalize_name(re.split(r"[\s=<>!~;\[@]", line, maxsplit=1)[0]))
    return names


def select_pins(pins: Iterable[Pin], on_host: Iterable[str]) -> tuple[list[Pin], list[Pin]]:
    """Split pins into (to fetch, on the host already); names compared per PEP 503."""
    host_keys = {normalize_name(n) for n in on_host}
    kept, skipped = [], []
    for pin in pins:
        (skipped if pin.key in host_keys else kept).append(pin)
    return kept, skipped


def find_uv() -> str:
    """The project environment's uv (beside this Python), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if not found:
        raise WheelhouseError("uv not found beside this Python nor on PATH: run `make setup`")
    return found


def export_runtime(project: Path = ROOT) -> str:
    """uv.lock's runtime group as requirements text (markers and hashes kept)."""
    if not (project / "uv.lock").is_file():
        raise WheelhouseError(f"{project / 'uv.lock'}: no such file (run `make lock`)")
    proc = subprocess.run(
        [find_uv(), *EXPORT_ARGS, "--project", str(project)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise WheelhouseError(f"uv export failed:\n{_tail(proc)}")
    return proc.stdout


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
    arch: str = "x86_64"
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


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(pin: Pin, dest: Path, opts: Options) -> tuple[Path | None, str]:
    """Download the target's binary wheel for pin into dest; (None, pip's output) if none."""
    args = ["download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    args += ["--python-version", opts.python_version, "--implementation", "cp"]
    args += [arg for plat in opts.platforms for arg in ("--platform", plat)]
    args += [*opts.index_args(), "--dest", str(dest), str(pin)]
    proc = _pip(opts.python, args)
    if proc.returncode != 0:
        return None, _tail(proc)
    wheel = _single_wheel(dest, pin)
    if pin.hashes and sha256_of(wheel) not in pin.hashes:
        raise WheelhouseError(
            f"{pin}: {wheel.name} has SHA-256 {sha256_of(wheel)}, which the lock does not list "
            f"for this pin ({len(pin.hashes)} hashes): the index served another file"
        )
    return wheel, ""


def build_wheel(pin: Pin, dest: Path, opts: Options) -> Path:
    """Build pin's sdist into a wheel with the local pip; only pure-Python results pass."""
    # A requirements file carries the lock's hashes, so pip checks the sdist it builds from.
    requirement = dest / "requirement.txt"
    requirement.write_text(pin.requirement_line() + "\n", encoding="utf-8")
    args = ["wheel", "--no-deps", "--no-binary", pin.name, "--wheel-dir", str(dest)]
    if not opts.build_isolation:
        args.append("--no-build-isolation")
    args += [*opts.index_args(), "-r", str(requirement)]
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
            f"on a Linux {opts.arch} machine with CPython {opts.python_version} "
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
            f"{names}\nList what the host has in --host-packages, or raise --max-mib."
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
            "Download (or build, for pure-Python sdists) one wheel per pin of uv.lock's runtime "
            "group for a target CPython on Linux, leaving out what the target host has."
        ),
    )
    p.add_argument("--python-version", default="3.12", help="target CPython X.Y (default 3.12)")
    p.add_argument(
        "--arch", choices=ARCHES, default="x86_64", help="target machine (default x86_64)"
    )
    p.add_argument(
        "--host-packages",
        type=Path,
        required=True,
        help="distributions the target host already has, one per line (e.g. `python3 -m pip "
        "list --format=freeze` run there, or tools/host-packages/nvidia-h200.txt); an empty "
        "file for a bare host",
    )
    p.add_argument(
        "--requirements",
        type=Path,
        help="pinned requirements with markers and hashes (default: uv.lock's runtime group, "
        "from `uv export --no-dev`)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="wheelhouse folder")
    p.add_argument("--max-mib", type=float, default=60.0, help="fail above this total size")
    p.add_argument(
        "--platform",
        action="append",
        dest="platforms",
        help="target platform tag, repeatable (default manylinux_2_39..2_17, manylinux2014, "
        "manylinux2010, manylinux1, for --arch)",
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


def selection(
    requirements: str, source: str, on_host: Iterable[str], python_version: str, arch: str
) -> tuple[list[Pin], list[Pin], int]:
    """(to fetch, on the host already, pins not for the target) from requirements text."""
    pins = parse_requirements(requirements, source)
    target = for_target(pins, target_environment(python_version, arch), source)
    kept, skipped = select_pins(target, on_host)
    return kept, skipped, len(pins) - len(target)


def _requires_python() -> SpecifierSet:
    """pyproject.toml's requires-python: the CPython versions a wheelhouse can be for."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return SpecifierSet(tomllib.load(f)["project"]["requires-python"])


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        raise InputError(f"--python-version must look like 3.12, not {args.python_version!r}")
    supported = _requires_python()
    # some release of that minor version allowed (requires-python may name a patch: >=3.11.4)
    if not any(f"{args.python_version}.{patch}" in supported for patch in range(100)):
        raise InputError(
            f"--python-version {args.python_version}: the project needs CPython {supported} "
            "(pyproject.toml's requires-python); name the host's Python, e.g. PY=3.12"
        )
    for label, path in (
        ("--host-packages", args.host_packages),
        ("--requirements", args.requirements),
    ):
        if path is not None and not path.is_file():
            raise InputError(f"{label} {path}: no such file")
    if args.requirements is not None:
        source = str(args.requirements)
        requirements = args.requirements.read_text(encoding="utf-8")
    else:
        source, requirements = "uv.lock (runtime group)", export_runtime()
    on_host = parse_name_list(args.host_packages.read_text(encoding="utf-8"))
    kept, skipped, other = selection(requirements, source, on_host, args.python_version, args.arch)
    print(
        f"{source}: {len(kept) + len(skipped)} pins for CPython {args.python_version} on Linux "
        f"{args.arch} ({other} for other platforms); {len(skipped)} already on the host "
        f"({args.host_packages}), {len(kept)} to fetch"
    )
    if not kept:
        raise WheelhouseError("nothing left to fetch: the host has every pin")
    opts = Options(
        python_version=args.python_version,
        platforms=args.platforms or platform_tags(args.arch),
        find_links=[str(Path(x).resolve()) if Path(x).exists() else x for x in args.find_links],
        no_index=args.no_index,
        build_isolation=not args.no_build_isolation,
        arch=args.arch,
    )
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        wheels = fetch_all(kept, Path(tmp), opts, args.jobs)
        print(summary_table(wheels))
        check_size(wheels, args.max_mib)
        header = [
            f"Wheelhouse for CPython {args.python_version} on Linux {args.arch}, made by "
            f"tools/wheelhouse.py from {source}; {len(skipped)} pins on the host left out "
            f"({args.host_packages.name}).",
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
        return 2 if isinstance(exc, InputError) else 1


if __name__ == "__main__":
    sys.exit(main())
