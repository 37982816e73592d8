#!/usr/bin/env bash
# DDP scaling on an air-gapped multi-GPU host: how the GPUs are linked, benchmarks/scaling.py
# at the default and a larger global batch (with profiles), then the GPU tests. Each phase has
# a time limit so that what finished comes back. Writes to $OUT (default: ./scaling-run).
#   BATCH_SIZES="512 4096" ONLY="gpu ddp2" bash benchmarks/gpu-host-scaling.sh
set -uo pipefail
OUT="${OUT:-$PWD/scaling-run}"
mkdir -p "$OUT"
source benchmarks/gpu-host-setup.sh

{
  nvidia-smi
  nvidia-smi topo -m
  nvidia-smi nvlink -s
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  nproc
} > "$OUT/env.txt" 2>&1
dvc repro prepare > "$OUT/prepare.log" 2>&1
for batch in ${BATCH_SIZES:-512 4096}; do
  timeout "${PHASE_LIMIT_S:-300}" python3 benchmarks/scaling.py --batch-sizes "$batch" \
    --out "$OUT/scaling-$batch" --profile ${ONLY:+--only $ONLY} 2>&1 | tee "$OUT/scaling-$batch.log"
done
timeout "${TEST_LIMIT_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/test_distributed.py tests/test_engine.py > "$OUT/pytest-gpu.log" 2>&1
echo "pytest -m gpu: exit $?" >> "$OUT/pytest-gpu.log"
