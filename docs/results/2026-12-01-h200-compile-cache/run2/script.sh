#!/usr/bin/env bash
# Issue 26 parts 2 and 3 on one H200, a machine other than the one that made the cache:
# a fresh clone given only compile-cache/*.bin from that machine (cc1.tgz), a whole fresh
# `dvc repro`, every stage's phases kept; then the import and MLflow costs alone.
set -uo pipefail
: "${OUT:?}"
W=$PWD
export ACCELBENCH_MNIST_MIRROR=$W/../mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$OUT/setup.log" 2>&1
python3 - > "$OUT/versions.txt" 2>&1 <<'PY'
import platform, torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name(), "python", platform.python_version())
PY
nvidia-smi --query-gpu=name,driver_version --format=csv >> "$OUT/versions.txt"
secs() { python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" "$1"; }
git clone -q "$W" /tmp/B && cd /tmp/B
tar xzf "$W/../cc1.tgz"
head -c 300 compile-cache/gpu.bin > "$OUT/key.txt"; echo >> "$OUT/key.txt"
s=$(date +%s.%N)
timeout 400 dvc repro > "$OUT/B-repro.log" 2>&1; echo "rc=$? wall=$(secs $s) s" >> "$OUT/B-repro.log"
tar czf "$OUT/B.tgz" reports env metrics dvc.lock .accelbench/timings 2>/dev/null
# which imports a training process makes on this host (and who makes them)
sed 's/^  epochs: 10/  epochs: 1/' params.yaml > /tmp/d.yaml
timeout 60 python3 -X importtime -m accelbench.cli --params /tmp/d.yaml train gpu --data data/prepared \
  --model /tmp/i-gpu.pt --metrics /tmp/i-metrics --quiet 2> "$OUT/importtime-train.txt" >/dev/null
{ echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}"; python3 -c "import sys; print(sys.executable, sys.flags.dont_write_bytecode)";
  find /opt/torch/.venv -name '*.pyc' | wc -l; find /opt/torch/.venv -name '*.py' | wc -l; pip list 2>/dev/null | wc -l; } > "$OUT/host-python.txt" 2>&1
cd /tmp/B && timeout 100 python3 "$W/../probe.py" > "$OUT/probe.txt" 2>&1
