#!/usr/bin/env bash
# DDP scaling on an air-gapped multi-GPU host: how the GPUs are linked, then
# benchmarks/scaling.py (with profiles) once per argument, then the GPU tests (RUN_TESTS=0 to
# skip them). An argument is a batch size, or several joined by "+" (one sweep, so a run
# serves every row that needs it, and a DDP row gets its bound from the baseline at the
# per-GPU batch), optionally with the candidates to run:
#   bash benchmarks/gpu-host-scaling.sh 512 4096:gpu,ddp2,gpu_eager,ddp2_eager
#   bash benchmarks/gpu-host-scaling.sh 256+512+1024+2048:gpu,ddp2
# Each phase has a time limit (PHASE_LIMIT_S, TEST_LIMIT_S) so what finished comes back.
# PROFILE=1 (the default; PROFILE= to leave it out) traces each run's steps of epoch 2.
# SCALING="strong weak" (the default) measures both: the batch as the global batch, and as
# each GPU's batch (benchmarks/scaling.py --scaling).
# Writes to $OUT (default: ./scaling-run).
set -uo pipefail
PROFILE="${PROFILE-1}"
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
for phase in "${@:-512}"; do
  batch="${phase%%:*}"
  IFS=+ read -ra batches <<< "$batch"
  tag="${batch//+/-}"  # file names: 256-512-1024
  only=()
  [[ "$phase" == *:* ]] && IFS=, read -ra names <<< "${phase#*:}" && only=(--only "${names[@]}")
  timeout "${PHASE_LIMIT_S:-300}" python3 benchmarks/scaling.py --batch-sizes "${batches[@]}" \
    --out "$OUT/scaling-$tag" ${PROFILE:+--profile} --scaling ${SCALING:-strong weak} "${only[@]}" 2>&1 \
    | tee "$OUT/scaling-$tag.log"
  tar czf "$OUT/scaling-$tag.tgz" -C "$OUT" "scaling-$tag"  # logs, metrics, profiles
done
if [ "${RUN_TESTS:-1}" = 1 ]; then
  timeout "${TEST_LIMIT_S:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider \
    tests/test_torchrun.py tests/test_engine.py > "$OUT/pytest-gpu.log" 2>&1
  echo "pytest -m gpu: exit $?" >> "$OUT/pytest-gpu.log"
fi
