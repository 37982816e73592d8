#!/usr/bin/env bash
# Where does a machine's first cuDNN conv spend its seconds: the page cache (cold library
# files) or the CUDA driver's JIT cache? No workspace needed: torch from the host image.
set -uo pipefail
R=$OUT/r; mkdir -p "$R"; rm -rf /tmp/jc*
exec > >(tee "$R/log.txt") 2>&1
D=$(cd "$(dirname "$0")" && pwd)
id; nproc; free -g | head -2; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"
SP=$(python3 -c "import site;print(site.getsitepackages()[0])"); echo "site $SP"
env | grep -E '^(CUDA_|HOME|XDG)' ; ls -la ~/.nv 2>&1; du -sh ~/.nv 2>&1
du -sh "$SP"/nvidia/* "$SP"/torch/lib 2>/dev/null
resid() { fincore --bytes "$SP"/nvidia/cudnn/lib/*.so* "$SP"/torch/lib/libtorch_cuda.so 2>&1 | awk '{print $1, $NF}' | sed "s#$SP/##" | tr '\n' ' '; echo; }
echo "== residency before anything:"; resid
python3 "$D/conv2.py" A-first-default
echo "== residency after A:"; resid; du -sh ~/.nv 2>&1
python3 "$D/conv2.py" B-second-default
CUDA_CACHE_PATH=/tmp/jcE python3 "$D/conv2.py" C-empty-jit-cache; du -sh /tmp/jcE
CUDA_CACHE_DISABLE=1 python3 "$D/conv2.py" D-jit-cache-disabled
python3 "$D/evict.py"; echo "== residency after evict:"; resid
python3 "$D/conv2.py" E-after-evict
python3 "$D/evict.py"; t=$(date +%s.%N); cat "$SP"/nvidia/cudnn/lib/*.so* "$SP"/nvidia/cublas/lib/*.so* "$SP"/torch/lib/libtorch_cuda.so > /dev/null; echo "pre-read $(echo "$(date +%s.%N) - $t" | bc) s"
python3 "$D/conv2.py" F-evict-then-preread
python3 "$D/evict.py"; python3 "$D/conv2.py" G-evict-nobench nobench
python3 "$D/conv2.py" H-warm-nobench nobench
python3 "$D/evict.py"; CUDA_CACHE_PATH=/tmp/jcF python3 "$D/conv2.py" I-evict-and-empty-jit
