#!/usr/bin/env bash
# Which workspace state makes the first conv calls fast (p26g/h: 1.0-1.9 s each in the first
# process of a clone, 0.1-0.25 s in the second). P1 goes portable then warm; fresh clones get
# gpu.bin plus P1's compile-cache folder, whole or less one part; a bare cuDNN conv process.
set -uo pipefail
: "${OUT:?}"
W=$PWD
R=$OUT/r; mkdir -p $R
rm -rf /tmp/P /tmp/C /tmp/P1 /tmp/Q*
export ACCELBENCH_MNIST_MIRROR=$W/../mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
mkdir -p /tmp/m1 && cd /tmp/m1 && python3 $W/../conv1.py bare-first >> $R/summary.txt 2>&1; python3 $W/../conv1.py bare-second >> $R/summary.txt 2>&1
git clone -q "$W" /tmp/P && cd /tmp/P && dvc repro prepare > "$R/prepare.log" 2>&1
sed 's/^  epochs: 10/  epochs: 2/' params.yaml > /tmp/d.yaml
train() {  # $1 clone dir, $2 label
  cd "$1"
  accelbench --params /tmp/d.yaml train gpu --data /tmp/P/data/prepared \
    --model /tmp/$2.pt --metrics /tmp/$2 --compile-cache compile-cache/gpu.bin --quiet > "$R/$2.log" 2>&1
  python3 -c "import json; d=json.load(open('/tmp/$2/train.json')); print('$2', d.get('compile_cache'), round(d['first_epoch_s'],2))" >> "$R/summary.txt" 2>&1
}
clone() { git clone -q "$W" "$1" && mkdir -p "$1/compile-cache" "$1/.accelbench" && cp /tmp/gpu.bin "$1/compile-cache/gpu.bin"; }
git clone -q "$W" /tmp/C; mkdir -p /tmp/C/compile-cache; train /tmp/C cold
cp /tmp/C/compile-cache/gpu.bin /tmp/gpu.bin
clone /tmp/P1; train /tmp/P1 portable1; train /tmp/P1 warm1
CACHE1=/tmp/P1/.accelbench/compile-cache
clone /tmp/Q1; cp -a $CACHE1 /tmp/Q1/.accelbench/; train /tmp/Q1 copy-all
clone /tmp/Q2; cp -a $CACHE1 /tmp/Q2/.accelbench/; rm -rf /tmp/Q2/.accelbench/compile-cache/triton; train /tmp/Q2 copy-all-but-triton
clone /tmp/Q3; cp -a $CACHE1 /tmp/Q3/.accelbench/; rm -rf /tmp/Q3/.accelbench/compile-cache/{fxgraph,aotautograd}; train /tmp/Q3 copy-all-but-graphs
clone /tmp/Q4; mkdir -p /tmp/Q4/.accelbench/compile-cache; cp -a $CACHE1/{fxgraph,aotautograd,triton,cache} /tmp/Q4/.accelbench/compile-cache/ 2>/dev/null; train /tmp/Q4 graphs-triton-autotune-only
cd /tmp/m1 && python3 $W/../conv1.py bare-after >> $R/summary.txt 2>&1
(cd $CACHE1 && ls -la; find . -maxdepth 1 -type d | wc -l; find . -name "*.best_config" | head -3; ls cache | head) > $R/P1-cache.txt 2>&1
(cd /tmp/P1 && git status --short --ignored | head -30) > $R/P1-status.txt 2>&1
cat "$R/summary.txt"
cd $OUT && tar czf r.tgz r && rm -rf r
