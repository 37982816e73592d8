#!/usr/bin/env bash
# The devcontainer's postCreateCommand, run by VS Code as `dev` (whose uid it changed to the
# host user's) in the checkout at /workspace. Any failure fails the container's creation.
set -euo pipefail
# The DVC cache and the tool caches are named volumes, created owned by root.
for dir in .dvc/cache "$HOME/.cache"; do
  [ -w "$dir" ] || sudo install -d -o "$(id -u)" -g "$(id -g)" "$dir"
done
# The checkout's code is what runs (the image's PYTHONPATH), not the copy baked into the image.
python - <<'PY'
import sys

import accelbench

if not accelbench.__file__.startswith("/workspace/src/"):
    sys.exit(f"accelbench is imported from {accelbench.__file__}, not from the checkout at /workspace")
print(f"accelbench from {accelbench.__file__}")
PY
status=0
accelbench doctor || status=$?
[ "$status" -ne 1 ]   # 0: GPU ready, 3: CPU only; 1: a problem, printed above with what to do
