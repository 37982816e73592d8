"""pydantic's validation errors as one line each, naming the key, the value and what is
allowed: params.yaml's (`params.py`) and the stage files' (`results.py`) alike."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from accelbench.core.console import clip, echo

# Keys that moved, and where to now.
MOVED = {
    ("train", "loader"): "set it on the variant that uses it, as variants.<name>.loader "
    "(batches: dataloader only), so that other variants do not depend on it",
}
# Why a key's bounds are what they are, added to its errors.
HINTS = {"seed": "seeds are 0..4294967295, 2**32 - 1: what numpy and torch accept"}
# pydantic's error types for a key a model (or dataclass) does not have, and for one it lacks
UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")
MISSING = ("missing", "missing_argument", "missing_keyword_argument")
MAX_PROBLEMS = 20  # listed; the rest are counted


def _fields(kind: Any) -> dict[str, Any] | None:
    """The fields of a pydantic model or pydantic dataclass (None: `kind` is neither)."""
    return getattr(kind, "__pydantic_fields__", None) if isinstance(kind, type) else None


def _model_at(loc: tuple[Any, ...], root: type) -> type | None:
    """The pydantic model (or dataclass) under `root` that owns the key at `loc` (for listing
    allowed keys): each part of `loc` is a field of a model, a mapping's key or a list's index."""
    kind: Any = root
    for part in loc[:-1]:
        fields = _fields(kind)
        if fields is not None:
            kind = fields[part].annotation if part in fields else None
        elif get_origin(kind) in (dict, list):
            kind = get_args(kind)[-1]
        else:
            return None
        kind = _unwrapped(kind)
    return kind if _fields(kind) is not None else None


def _unwrapped(kind: Any) -> Any:
    """`X` of `X | None` and of `Annotated[X, ...]`."""
    while get_origin(kind) in (Union, UnionType, Annotated):
        kind = next((k for k in get_args(kind) if k is not type(None)), None)
    return kind


def _keys(model: type, flat: tuple[str, ...]) -> list[str]:
    """The keys `model` allows: its fields' names (or aliases), those of the records named in
    `flat` in their place (a file that holds their keys flat)."""
    keys = []
    for name, field in _fields(model).items():
        nested = _fields(_unwrapped(field.annotation)) if name in flat else None
        keys += list(nested) if nested else [field.alias or name]
    return keys


def _describe(error: dict[str, Any], root: type, flat: tuple[str, ...] = ()) -> str:
    loc = tuple(p for p in error["loc"] if p != "[key]")  # a mapping's key: named as itself
    key = ".".join(clip(str(p)) for p in loc) or "(top level)"
    if not loc:  # a check across keys: the message names them
        return error["msg"].removeprefix("Value error, ")
    if error["type"] in UNKNOWN and loc in MOVED:
        return f"{key}: moved: {MOVED[loc]}"
    if error["type"] in UNKNOWN:
        owner = _model_at(loc, root)
        allowed = ", ".join(_keys(owner, flat)) if owner else "see docs/pipeline.md"
        return f"{key}: unknown key (allowed keys here: {allowed})"
    if error["type"] in MISSING:
        return f"{key}: required key is missing"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "finite_number":
        message = "must be a finite number (not .inf, -.inf or .nan)"
    if loc[-1] in HINTS:
        message += f" ({HINTS[loc[-1]]})"
    return f"{key} = {echo(error.get('input'))}: {message}"


def problems(errors: list[Any], root: type, flat: tuple[str, ...] = ()) -> list[str]:
    """Each of pydantic's `errors` validating `root` in a line naming the key, the value and
    what is allowed (at most MAX_PROBLEMS). `flat`: records whose keys the file holds flat."""
    lines = [_describe(e, root, flat) for e in errors[:MAX_PROBLEMS]]
    if len(errors) > MAX_PROBLEMS:
        lines.append(f"... and {len(errors) - MAX_PROBLEMS} more")
    return lines
