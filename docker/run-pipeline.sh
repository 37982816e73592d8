#!/usr/bin/env bash
# The image's default command: check the GPU stack, then run the pipeline.
# A checkout mounted at /workspace is used (and installed over the image's copy); otherwise
# the copy baked into the image at /opt/accelbench runs.
set -euo pipefail
if [ -f /workspace/dvc.yaml ]; then
  pip install --quiet --no-deps --no-build-isolation -e /workspace
  cd /workspace
else
  cd /opt/accelbench
  [ -d .git ] || git init --quiet   # DVC keeps its bookkeeping next to a git repository
fi
status=0
accelbench doctor || status=$?
if [ "$status" -eq 1 ]; then
  echo "accelbench doctor found problems (above); not running the pipeline." >&2
  exit 1
fi
exec dvc repro "$@"
