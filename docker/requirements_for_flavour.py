"""The image's requirement lists for one CUDA flavour of torch, made from uv.lock's export.

    uv export --frozen --no-dev --no-emit-project -o runtime.txt
    python3 requirements_for_flavour.py FLAVOUR runtime.txt OUT_DIR

writes OUT_DIR/requirements.txt (for `pip install -r`, from PyPI, markers and hashes as the
lock has them) and OUT_DIR/torch.txt (for `pip install --index-url
https://download.pytorch.org/whl/FLAVOUR -r`, empty for the default).

cu130 is the lock as it is: PyPI's torch wheels are CUDA 13.0 builds. Any other flavour (cu126,
cu128, ...) takes torch and torchvision from PyTorch's own index, which brings that CUDA
version's libraries; so its list drops torch, torchvision and the CUDA 13 stack they pulled
into the lock, and keeps everything else, the project's own NVIDIA package (nvidia-ml-py, the
NVML bindings behind `accelbench doctor`, GPU system metrics and the energy reader) included.
torch.txt keeps the pins and markers but not the hashes: those are of PyPI's CUDA 13 builds.
Standard library only: it runs in the image before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DEFAULT_FLAVOUR = "cu130"
TORCH = ("torch", "torchvision")
# What torch's CUDA wheels depend on: the CUDA libraries, their Python bindings, Triton.
CUDA_STACK = re.compile(r"^(triton|nvidia-.+|cuda-.+)$")
# NVIDIA packages the project itself depends on (pyproject.toml), never torch's.
PROJECT_NVIDIA = frozenset({"nvidia-ml-py"})


def _name(line: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0].strip()).lower()


def requirements(export_text: str) -> list[str]:
    """One entry per requirement: its first line and its `--hash` continuation lines."""
    entries: list[str] = []
    for line in export_text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace() and entries and entries[-1].rstrip().endswith("\\"):
            entries[-1] += "\n" + line
        elif line[0].isspace() or line.startswith("-"):
            raise ValueError(f"not a requirement from `uv export`: {line.strip()!r}")
        else:
            entries.append(line)
    return entries


def _without_hashes(entry: str) -> str:
    return entry.splitlines()[0].rstrip(" \\")


def split_lock(export_text: str, flavour: str) -> tuple[list[str], list[str]]:
    """(requirements from PyPI, torch pins from PyTorch's index) for one CUDA flavour."""
    if not re.fullmatch(r"cu\d{3}", flavour):
        raise ValueError(f"TORCH_CUDA={flavour!r}: expected cuXYZ, e.g. cu126, cu128, cu130")
    entries = requirements(export_text)
    if flavour == DEFAULT_FLAVOUR:
        return entries, []
    torch = [_without_hashes(entry) for entry in entries if _name(entry) in TORCH]
    rest = [
        entry
        for entry in entries
        if _name(entry) not in TORCH
        and (_name(entry) in PROJECT_NVIDIA or not CUDA_STACK.match(_name(entry)))
    ]
    return rest, torch


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    flavour, export, out = argv[0], Path(argv[1]), Path(argv[2])
    try:
        kept, torch = split_lock(export.read_text(), flavour)
    except ValueError as exc:
        print(f"requirements_for_flavour: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    (out / "requirements.txt").write_text("".join(f"{entry}\n" for entry in kept))
    (out / "torch.txt").write_text("".join(f"{pin}\n" for pin in torch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
