"""The stages' output files: their names, and how a stage writes them without harm.

A variant's metrics folder is `MetricsFiles`; the env stage writes `env/<device>.json`. A
stage claims its outputs before any work (a user's file at an output path is refused, never
replaced), then writes them all at once (`staged`) or each atomically (`write_json`).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelbench.core.console import InputError

STAGED_PREFIX = ".new."  # keeps the suffix: matplotlib and torch go by it
# A path that exists is replaced only when it is recognisably what accelbench writes there (a
# marker, or the expected structure): docs/reliability.md, "What accelbench writes".
_MAX_RECOGNISED_BYTES = 64 << 20  # a results file this large is someone else's


@dataclass(frozen=True)
class Kind:
    """What accelbench writes at an output path, and how to recognise it there."""

    description: str  # "a results file written by accelbench": the refusal names it
    recognise: Callable[[Path], bool]  # the existing file (links followed) is one of ours


def _head(path: Path, size: int = 4096) -> bytes:
    with path.open("rb") as handle:
        return handle.read(size)


def json_payload(path: Path) -> Any:
    """A file's JSON (None: not JSON, or too large to be a results file)."""
    if path.stat().st_size > _MAX_RECOGNISED_BYTES:
        return None
    try:
        return json.loads(path.read_bytes())
    except ValueError:
        return None


def json_kind(description: str, *keys: str) -> Kind:
    """A JSON object (with `keys`, where given)."""

    def recognise(path: Path) -> bool:
        payload = json_payload(path)
        return isinstance(payload, dict) and all(key in payload for key in keys)

    return Kind(description, recognise)


def text_kind(description: str, first_line: str) -> Kind:
    """A text file whose first line starts with `first_line` (a CSV's header, a title)."""
    prefix = first_line.encode()
    return Kind(description, lambda path: _head(path, len(prefix)) == prefix)


def _matplotlib_png(path: Path) -> bool:
    head = _head(path)  # matplotlib names itself in a tEXt chunk before the image data
    return head.startswith(b"\x89PNG\r\n\x1a\n") and b"Software\x00Matplotlib" in head


def _model_file(path: Path) -> bool:
    head = _head(path, 512)
    if head.startswith(b"{"):  # a skipped variant's, as JSON
        payload = json_payload(path)
        return isinstance(payload, dict) and {"variant", "status"} <= set(payload)
    # torch.save's zip: its first entry is `<archive>/data.pkl`
    return head.startswith(b"PK\x03\x04") and b"/data.pkl" in head[:128]


RESULTS_FILE = json_kind("a results file written by accelbench", "status")
FIGURE = Kind("a figure written by accelbench (a matplotlib PNG)", _matplotlib_png)
MODEL = Kind("a model file written by `accelbench train`", _model_file)
ENV_FACTS = {
    "cpu": json_kind("an env facts file written by `accelbench env`", "cpu_model"),
    "cuda": json_kind("an env facts file written by `accelbench env`", "cuda_available"),
}
ENV_DEVICES = ("cpu", "cuda")  # env/<device>.json; a variant's stage depends on its device's


def env_json(folder: Path, device: str) -> Path:
    return folder / f"{device}.json"


_KINDS_BY_NAME: dict[str, Kind] = {}  # a metrics file's, by its name (`_in_folder`)
_KINDS_BY_SUFFIX = {".png": FIGURE, ".pt": MODEL}


def _in_folder(name: str, kind: Kind | None = None) -> property:
    """A MetricsFiles path: `name` in its folder, and what accelbench writes there (`kind`;
    by default, by its suffix)."""
    if kind is not None:
        _KINDS_BY_NAME[name] = kind
    return property(lambda files: files.folder / name, doc=f"`{name}` in the folder")


@dataclass(frozen=True)
class MetricsFiles:
    """One variant's metrics folder (`metrics/<variant>/` in dvc.yaml) and its files."""

    folder: Path

    train_json = _in_folder("train.json", RESULTS_FILE)
    epochs_csv = _in_folder(
        "epochs.csv", text_kind("an epochs.csv written by `accelbench train`", "epoch")
    )
    eval_json = _in_folder("eval.json", RESULTS_FILE)
    confusion_csv = _in_folder(
        "confusion.csv", text_kind("a confusion.csv written by accelbench", "actual,predicted")
    )
    confusion_png = _in_folder("confusion.png")
    run_json = _in_folder("run.json", RESULTS_FILE)
    per_class_csv = _in_folder(
        "per_class.csv",
        text_kind("a per_class.csv written by accelbench", "digit,precision,recall,f1"),
    )
    quantized_json = _in_folder("quantized.json", RESULTS_FILE)


def refuse_foreign(path: Path, kind: Kind | None = None) -> None:
    """An InputError, before anything is written, if `path` exists and is not what accelbench
    writes there (`kind`; by default, by its name). Absent, or a dangling link: fine."""
    kind = kind or _KINDS_BY_NAME.get(path.name) or _KINDS_BY_SUFFIX.get(path.suffix)
    if kind is None:  # a programming error: other outputs name their kind
        raise ValueError(f"{path.name}: no output kind registered for it; pass one")
    if not path.exists():
        return
    found = "a folder" if path.is_dir() else a_file(path)
    try:
        if found == "a file" and kind.recognise(path):  # a special file is never opened
            return
    except OSError as exc:
        raise InputError(
            f"{path}: exists and cannot be read ({exc.strerror}); accelbench replaces "
            "only its own outputs: fix its permissions, move it away or pass another path"
        ) from None
    raise InputError(
        f"{path}: exists and is {found}, not {kind.description}; accelbench replaces only "
        "its own outputs: move it away or pass another path"
    )


def refuse_foreign_folder(folder: Path) -> None:
    """An output folder (`--metrics`, `--out`) that is a file or a symlink loop is refused."""
    try:
        folder.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(
                f"{folder}: is a symbolic link loop, not a folder; accelbench writes its outputs "
                "into a folder: remove or fix the link, or pass another path"
            ) from None
    if folder.exists() and not folder.is_dir():
        raise InputError(
            f"{folder}: exists and is {a_file(folder)}, not a folder; accelbench writes its "
            "outputs into a folder: move it away or pass another path"
        )


def a_file(path: Path) -> str:
    """What an existing `path` that is no folder is: a file, or a special one (a FIFO...)."""
    return "a file" if path.is_file() else "a special file"


def claim(*finals: Path) -> None:
    """At a stage's start: every output path is absent or one of ours (by its name's kind)."""
    for final in finals:
        refuse_foreign_folder(final.parent)
        refuse_foreign(final)


@dataclass
class StagedOutputs:
    """Where a stage writes its outputs before they are renamed into place (`staged`)."""

    pending: list[tuple[Path, Path]] = field(default_factory=list)  # (temporary, final)
    removals: list[Path] = field(default_factory=list)

    def __call__(self, final: Path, kind: Kind | None = None) -> Path:
        """The temporary to write `final` to (beside it: the rename stays on one disk);
        refused if `final` is not one of ours (`kind`: by default, by its name)."""
        refuse_foreign_folder(final.parent)
        refuse_foreign(final, kind)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.with_name(STAGED_PREFIX + final.name)
        temporary.unlink(missing_ok=True)  # a leftover (or a link): never written through
        self.pending.append((temporary, final))
        return temporary

    def remove(self, final: Path, kind: Kind | None = None) -> None:
        """Remove `final` (one of ours, no longer produced) when the outputs are renamed."""
        refuse_foreign(final, kind)
        self.removals.append(final)


@contextmanager
def staged() -> Iterator[StagedOutputs]:
    """A stage's outputs, all new or all old: each is written to a temporary, all renamed into
    place once every one was written (a full disk leaves the old ones and no temporaries). A
    rename replaces a link at the final path, never its target, and gives the file a new
    inode: a hard link into DVC's cache keeps the old content."""
    outputs = StagedOutputs()
    try:
        yield outputs
        for temporary, final in outputs.pending:
            os.replace(temporary, final)
        for final in outputs.removals:
            final.unlink(missing_ok=True)
    finally:
        for temporary, _ in outputs.pending:
            temporary.unlink(missing_ok=True)


def remove_leftovers(*finals: Path) -> None:
    """The temporaries of `finals` that a killed earlier run left behind."""
    for final in finals:
        for name in (
            STAGED_PREFIX + final.name,
            f".{final.name}.tmp",
            f".{STAGED_PREFIX}{final.name}.tmp",
        ):
            (final.parent / name).unlink(missing_ok=True)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary beside `path` to write; renamed onto `path` if the block succeeds, removed
    if it fails. Never writes through a link at `path` or at the temporary's name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, payload: Any) -> None:
    """Write JSON atomically: a crash never leaves a half-written metrics file."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write text (UTF-8) atomically, as write_json."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
