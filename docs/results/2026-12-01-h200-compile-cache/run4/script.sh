#!/usr/bin/env bash
# Is the portable-vs-warm gap Triton's own driver stubs (built with gcc into TRITON_CACHE_DIR,
# per workspace today)? Fresh clones given machine 1's gpu.bin, 2-epoch gpu training:
# W builds the stubs into /tmp/tc; X reuses /tmp/tc; Y starts with an empty /tmp/tc2.
set -uo pipefail
: "${OUT:?}"
W=$PWD
export ACCELBENCH_MNIST_MIRROR=$W/../mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$OUT/setup.log" 2>&1
git clone -q "$W" /tmp/P && cd /tmp/P && dvc repro prepare > "$OUT/prepare.log" 2>&1
sed 's/^  epochs: 10/  epochs: 2/' params.yaml > /tmp/d.yaml
train() {  # $1 label, $2 triton cache
  git clone -q "$W" /tmp/$1-ws && cd /tmp/$1-ws && tar xzf "$W/../cc1.tgz"
  TRITON_CACHE_DIR=$2 accelbench --params /tmp/d.yaml train gpu --data /tmp/P/data/prepared \
    --model /tmp/$1.pt --metrics /tmp/$1 --compile-cache compile-cache/gpu.bin --quiet > "$OUT/$1.log" 2>&1
  python3 -c "import json; d=json.load(open('/tmp/$1/train.json')); print('$1', d['compile_cache'], round(d['first_epoch_s'],2))" >> "$OUT/summary.txt"
  ls -R "$2" | head -40 > "$OUT/$1-triton-cache.txt"
}
train W /tmp/tc
train X /tmp/tc
train Y /tmp/tc2
cat "$OUT/summary.txt"
