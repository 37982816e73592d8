"""dvc.yaml's `deps` and `params` are exactly the code each stage runs and the keys it reads.

Both are derived from the code: the code, by walking the imports (with `ast`) from the CLI
and the stage's module; the keys, by running the stage's `select(params)` on the repository's
params.yaml with every read recorded. An edit then re-runs what it affects and nothing else.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from accelbench.core.params import load_params
from helpers import REPO

SRC = REPO / "src"
DVC_YAML = yaml.safe_load((REPO / "dvc.yaml").read_text())
PARAMS_YAML = yaml.safe_load((REPO / "params.yaml").read_text())
PARAMS = load_params(REPO / "params.yaml")


# --- the code a stage runs -------------------------------------------------------------------


def _module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(name: str) -> Iterator[str]:
    """The in-package modules `name` imports, at any depth of its code (function bodies too)."""
    path = _module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "accelbench" and _module_file(target):
                yield target


def import_closure(*roots: str) -> set[str]:
    """Every in-package module that importing `roots` runs, their packages' __init__ included."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for prefix in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if prefix not in seen:
                seen.add(prefix)
                todo.extend(_imports(prefix))
    return seen


def code_of(stage: str) -> set[str]:
    """`accelbench <stage>` runs the CLI, which imports `accelbench.stages.<stage>` by name."""
    modules = import_closure("accelbench.cli", f"accelbench.stages.{stage}")
    return {str(_module_file(m).relative_to(REPO)) for m in modules}


# --- the params a stage reads ----------------------------------------------------------------


class _Recorder:
    """Stands in for a params model (or mapping), recording the dotted key of every read."""

    def __init__(self, value: Any, path: str, reads: set[str]) -> None:
        self._value, self._path, self._reads = value, path, reads

    def _child(self, key: str, value: Any) -> Any:
        path = f"{self._path}.{key}" if self._path else key
        if isinstance(value, BaseModel | dict):
            return _Recorder(value, path, self._reads)
        self._reads.add(path)
        return value

    def __getattr__(self, name: str) -> Any:
        member = getattr(type(self._value), name, None)
        if callable(member):  # a method: run it on the recorder, so its reads are recorded too
            return lambda *args, **kwargs: member(self, *args, **kwargs)
        if isinstance(member, property):
            return member.fget(self)
        return self._child(name, getattr(self._value, name))

    def __getitem__(self, key: str) -> Any:
        return self._child(key, self._value[key])

    def __contains__(self, key: str) -> bool:
        return key in self._value

    def __iter__(self) -> Iterator[str]:
        return iter(self._value)


def _handed_over(value: Any, reads: set[str]) -> None:
    """A model or mapping handed over whole counts as read whole."""
    if isinstance(value, _Recorder):
        reads.add(value._path)
    elif is_dataclass(value):
        for f in fields(value):
            _handed_over(getattr(value, f.name), reads)


def _collapsed(keys: set[str], model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field of a section read: the section itself (as dvc.yaml would list it)."""
    out = set(keys)
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out = _collapsed(out, annotation, f"{path}.")
            children = {f"{path}.{child}" for child in annotation.model_fields}
            if children <= out:
                out = (out - children) | {path}
    return out


def params_read(stage: str, variant: str | None = None) -> set[str]:
    module = importlib.import_module(f"accelbench.stages.{stage}")
    reads: set[str] = set()
    takes_variant = len(inspect.signature(module.select).parameters) == 2
    args = (variant,) if takes_variant else ()
    _handed_over(module.select(_Recorder(PARAMS, "", reads), *args), reads)
    whole = {k for k in reads if any(k.startswith(f"{other}.") for other in reads)}
    return _collapsed(reads - whole, type(PARAMS))  # a key inside a section read whole: in it


def checks_of(stage: str) -> set[str]:
    """Keys a stage reads only to refuse to run (no output depends on them)."""
    return set(getattr(importlib.import_module(f"accelbench.stages.{stage}"), "CHECKS", ()))


# --- what dvc.yaml says ----------------------------------------------------------------------


def _resolve(text: str, key: str | None, item: dict | None) -> str:
    def value(match: re.Match) -> str:
        first, _, rest = match.group(1).partition(".")
        if first == "key":
            return key
        if first == "item":
            return str(item.get(rest, "resident" if rest == "batches" else None))
        return DVC_YAML["vars"][0][first][rest]

    return re.sub(r"\$\{([^}]+)\}", value, text)


def dvc_stages() -> Iterator[tuple[str, str, str | None, dict]]:
    """(stage name as dvc shows it, stage module, variant, resolved stage) for every stage."""
    for name, stage in DVC_YAML["stages"].items():
        if "foreach" not in stage:
            yield name, name, None, stage
            continue
        for key, item in PARAMS_YAML["variants"].items():
            body = yaml.safe_dump(stage["do"])
            yield f"{name}@{key}", name, key, yaml.safe_load(_resolve(body, key, item))


def _names(entries: list) -> set[str]:
    return {next(iter(e)) if isinstance(e, dict) else e for e in entries or []}


def declared_code(stage: dict) -> set[str]:
    return {d for d in _names(stage.get("deps")) if d.startswith("src/")}


def declared_params(stage: dict) -> set[str]:
    return _names(stage.get("params"))


STAGES = list(dvc_stages())
IDS = [name for name, *_ in STAGES]


@pytest.mark.parametrize(("name", "module", "variant", "stage"), STAGES, ids=IDS)
def test_a_stage_depends_on_exactly_the_code_it_runs(name, module, variant, stage) -> None:
    runs, listed = code_of(module), declared_code(stage)
    assert listed == runs, (
        f"dvc.yaml's {name} deps: add {sorted(runs - listed)}, remove {sorted(listed - runs)}"
    )


@pytest.mark.parametrize(("name", "module", "variant", "stage"), STAGES, ids=IDS)
def test_a_stage_depends_on_exactly_the_params_it_reads(name, module, variant, stage) -> None:
    reads, listed = params_read(module, variant) - checks_of(module), declared_params(stage)
    assert listed == reads, (
        f"dvc.yaml's {name} params: add {sorted(reads - listed)}, remove {sorted(listed - reads)}"
    )


def test_keys_read_only_to_refuse_are_enforced_by_the_stage_that_always_runs() -> None:
    """train.require_gpu changes no output; the env stage (always run) refuses in its place."""
    assert DVC_YAML["stages"]["env"]["always_changed"] is True
    for stage in DVC_YAML["stages"]:
        assert checks_of(stage) <= params_read("env"), stage


@pytest.mark.parametrize("stage", list(DVC_YAML["stages"]))
def test_a_stage_reads_params_only_through_its_select(stage) -> None:
    """`main(args, params, root)` hands `params` to `select` and uses it nowhere else."""
    path = SRC / "accelbench" / "stages" / f"{stage}.py"
    main = next(n for n in ast.parse(path.read_text()).body if getattr(n, "name", None) == "main")
    uses = [n for n in ast.walk(main) if isinstance(n, ast.Name) and n.id == "params"]
    selects = [
        n
        for n in ast.walk(main)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", None) == "select"
        and isinstance(n.args[0], ast.Name)
        and n.args[0].id == "params"
    ]
    assert len(uses) == len(selects) == 1, f"{path}: main must only call select(params, ...)"


def test_the_checks_catch_a_dependency_left_out() -> None:
    """The comparisons above are not vacuous: a module or a key dropped from dvc.yaml fails."""
    _, module, _, stage = next(s for s in STAGES if s[0] == "evaluate@cpu")
    assert "src/accelbench/data/batches.py" in code_of(module)  # normalization runs in evaluate
    without = [d for d in stage["deps"] if d != "src/accelbench/data/batches.py"]
    assert declared_code(stage | {"deps": without}) != code_of(module)
    _, module, variant, stage = next(s for s in STAGES if s[0] == "train@cpu")
    reads = params_read(module, variant) - checks_of(module)
    assert "train.shift_px" in reads
    fewer = [key for key in stage["params"] if key != "train.shift_px"]
    assert declared_params(stage | {"params": fewer}) != reads


def test_an_edit_to_one_stage_reruns_only_that_stage() -> None:
    """Each stage's own module is in its deps and in no other stage's."""
    for name, module, _, stage in STAGES:
        own = f"src/accelbench/stages/{module}.py"
        others = {f"src/accelbench/stages/{m}.py" for _, m, _, _ in STAGES if m != module}
        assert own in declared_code(stage) and not declared_code(stage) & others, name
