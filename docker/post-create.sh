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
# 0: GPU ready; 1: a problem, printed above with what to do; 3: CPU only, said out loud.
if [ "$status" = 3 ]; then
  if [ -n "${ACCELBENCH_GPU:-}" ] && [ "${ACCELBENCH_GPU}" != 0 ]; then
    echo "post-create: ACCELBENCH_GPU=$ACCELBENCH_GPU asked for a GPU and none reached this container." \
      "Podman or CDI-only Docker: set ACCELBENCH_GPU_ARG=--device=nvidia.com/gpu=all on the host" \
      "(the NVIDIA Container Toolkit's CDI spec: nvidia-ctk cdi generate);" \
      "Docker: install the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker)" \
      "and restart Docker. Then rebuild the container." >&2
    exit 1
  fi
  echo "post-create: CPU only: GPU variants will be skipped. A GPU host? See docs/containers.md" \
    "(ACCELBENCH_GPU=1 makes this an error; ACCELBENCH_GPU_ARG passes the GPU on Podman/CDI)."
  status=0
fi
[ "$status" = 0 ]
