"""The image's requirement lists for one CUDA flavour of torch, made from requirements.lock.

    python3 requirements_for_flavour.py FLAVOUR LOCK OUT_DIR

writes OUT_DIR/requirements.txt (for `pip install -r`, from PyPI) and OUT_DIR/torch.txt (for
`pip install --index-url https://download.pytorch.org/whl/FLAVOUR -r`, empty for the default).

cu130 is the lock as it is: PyPI's torch wheels are CUDA 13.0 builds. Any other flavour (cu126,
cu128, ...) takes torch and torchvision from PyTorch's own index, which brings that CUDA
version's libraries; so its list drops torch, torchvision and the CUDA 13 stack they pulled
into the lock, and keeps everything else, the project's own NVIDIA package (nvidia-ml-py, the
NVML bindings behind `accelbench doctor`, GPU system metrics and the energy reader) included.
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
    return re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0].strip().lower().replace("_", "-")


def split_lock(lock_text: str, flavour: str) -> tuple[list[str], list[str]]:
    """(requirements from PyPI, torch pins from PyTorch's index) for one CUDA flavour."""
    if not re.fullmatch(r"cu\d{3}", flavour):
        raise ValueError(f"TORCH_CUDA={flavour!r}: expected cuXYZ, e.g. cu126, cu128, cu130")
    pins = [
        line.strip()
        for line in lock_text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if flavour == DEFAULT_FLAVOUR:
        return pins, []
    torch = [pin for pin in pins if _name(pin) in TORCH]
    rest = [
        pin
        for pin in pins
        if _name(pin) not in TORCH
        and (_name(pin) in PROJECT_NVIDIA or not CUDA_STACK.match(_name(pin)))
    ]
    return rest, torch


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    flavour, lock, out = argv[0], Path(argv[1]), Path(argv[2])
    try:
        requirements, torch = split_lock(lock.read_text(), flavour)
    except ValueError as exc:
        print(f"requirements_for_flavour: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    (out / "requirements.txt").write_text("\n".join(requirements) + "\n")
    (out / "torch.txt").write_text("".join(f"{pin}\n" for pin in torch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
