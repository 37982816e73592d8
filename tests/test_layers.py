"""The package's folders are its layers, and imports only go down.

    cli                      the command line: parses, dispatches to one stage
    stages/                  one thin module per dvc.yaml stage
    training/  report/       training a variant; writing the comparison
    data/  evaluation/  system/   datasets; scoring a model; the machine, MLflow, lifetime
    core/                    params, results files, timing, console: no torch, no MLflow

A module imports its own folder or a lower layer, never a higher one nor a sibling folder of
its own layer. Type-only imports count: a cycle through `TYPE_CHECKING` is still a cycle in
the reader's head.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = REPO / "src" / "accelbench"
LAYERS = {
    "core": 0,
    "data": 1,
    "evaluation": 1,
    "system": 1,
    "training": 2,
    "report": 2,
    "stages": 3,
    "cli": 4,
}


def _folder(module: str) -> str:
    """'accelbench.training.engine' -> 'training'; 'accelbench.cli' -> 'cli'."""
    return module.split(".")[1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every in-package import, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            pytest.fail(f"{path}:{node.lineno}: relative import; import absolutely")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("accelbench"):
            for alias in node.names:  # `from accelbench.data import prepared` imports a module
                name = f"{node.module}.{alias.name}"
                found.append((node.lineno, name if _is_module(name) else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("accelbench.")]
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.name != "__init__.py")


def test_every_module_lives_in_a_layer() -> None:
    loose = [p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", *LAYERS)]
    assert not loose, f"modules outside a layer folder: {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= set(LAYERS), f"folders without a layer: {folders - set(LAYERS)}"


@pytest.mark.parametrize("path", MODULES, ids=[_module_name(p) for p in MODULES])
def test_imports_go_down_the_layers(path: Path) -> None:
    importer = _folder(_module_name(path)) if path.parent != PACKAGE else path.stem
    wrong = []
    for line, module in _imports(path):
        if module == "accelbench":
            continue
        imported = _folder(module)
        same_folder = imported == importer
        if not same_folder and LAYERS[imported] >= LAYERS[importer]:
            wrong.append(f"line {line}: {module} ({imported}, layer {LAYERS[imported]})")
    assert not wrong, (
        f"{path.relative_to(REPO)} ({importer}, layer {LAYERS[importer]}) imports "
        + ("; ".join(wrong))
    )


def test_the_check_catches_an_upward_import(tmp_path) -> None:
    """Not vacuous: core importing training is reported."""
    probe = tmp_path / "probe.py"
    probe.write_text("from accelbench.training import engine\n")
    (imported,) = [_folder(m) for _, m in _imports(probe)]
    assert LAYERS[imported] > LAYERS["core"]


CORE_MAY_NOT_LOAD = {"torch", "mlflow", "matplotlib", "pandas"}


@pytest.mark.parametrize(
    "module", sorted(f"accelbench.core.{p.stem}" for p in (PACKAGE / "core").glob("[!_]*.py"))
)
def test_core_loads_no_torch_and_no_mlflow(module: str) -> None:
    """CONTRIBUTING.md's rule for core/, checked as a process loads it (core/timing.py
    imported torch at the top, and nothing noticed)."""
    import subprocess
    import sys

    code = f"import sys, {module}; print(sorted(set({sorted(CORE_MAY_NOT_LOAD)!r}) & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]", f"{module} loads {loaded}"
