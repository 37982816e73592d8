#!/usr/bin/env bash
# The image's default command: check the GPU stack, then run the pipeline.
# A checkout mounted at /workspace is what runs (PYTHONPATH puts its src/ first, so nothing is
# installed at start and any uid can run it); otherwise a copy of the image's own checkout.
set -euo pipefail
if [ -f /workspace/dvc.yaml ]; then
  cd /workspace
else
  copy="$HOME/accelbench"
  if [ ! -d "$copy" ]; then
    cp -r /opt/accelbench "$copy"
    git -C "$copy" init --quiet   # DVC keeps its bookkeeping next to a git repository
  fi
  cd "$copy"
  export PYTHONPATH="$copy/src"
fi
status=0
accelbench doctor || status=$?
if [ "$status" -eq 1 ]; then
  echo "accelbench doctor found problems (above); not running the pipeline." >&2
  exit 1
fi
exec dvc repro "$@"
