#!/usr/bin/env bash
# The portable-vs-warm gap sits in the first conv calls (cuDNN, benchmark on): 1.0-1.4 s each
# portable, 0.1-0.25 s warm (p26g). Which processes use the GPU meanwhile, and what cuDNN
# does: cold (C), then portable (P1) and warm (P1 again), each with GPU process sampling
# and cuDNN's API log.
set -uo pipefail
: "${OUT:?}"
W=$PWD
R=$OUT/r; mkdir -p $R
rm -rf /tmp/P /tmp/C /tmp/P1
export ACCELBENCH_MNIST_MIRROR=$W/../mnist
ln -sfn ../.whl .whl
source benchmarks/gpu-host-setup.sh > "$R/setup.log" 2>&1
{ env | grep -iE 'cache|home|cuda|cudnn' ; ls -la ~/.nv ~/.nv/ComputeCache 2>&1 | head; python3 -c "import torch;print(torch.backends.cudnn.version())"; } > "$R/env.txt" 2>&1
git clone -q "$W" /tmp/P && cd /tmp/P && dvc repro prepare > "$R/prepare.log" 2>&1
sed 's/^  epochs: 10/  epochs: 2/' params.yaml > /tmp/d.yaml
train() {  # $1 clone dir, $2 label, then env assignments
  local dir=$1 label=$2; shift 2
  cd "$dir"
  ( while sleep 0.2; do echo "$(date +%s.%N) $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tr '\n' '|')"; done ) > "$R/$label.gpuprocs" 2>&1 &
  local mon=$!
  s=$(date +%s.%N)
  env "$@" SAMPLE_OUT=$R/$label python3 "$W/../sampler.py" --params /tmp/d.yaml train gpu --data /tmp/P/data/prepared \
    --model /tmp/$label.pt --metrics /tmp/$label --compile-cache compile-cache/gpu.bin --quiet > "$R/$label.log" 2>&1
  echo "rc=$? start $s process $(python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" $s) s" >> "$R/$label.log"
  kill $mon
  python3 -c "import json; d=json.load(open('/tmp/$label/train.json')); print('$label', d.get('compile_cache'), round(d['first_epoch_s'],2))" >> "$R/summary.txt" 2>&1
  ps -eo pid,ppid,etimes,cmd | grep -i -E "compile_worker|accelbench" | grep -v grep | cut -c1-200 >> "$R/$label.ps" 2>&1
}
git clone -q "$W" /tmp/C; mkdir -p /tmp/C/compile-cache; train /tmp/C cold X=1
cp /tmp/C/compile-cache/gpu.bin $R/gpu.bin
git clone -q "$W" /tmp/P1 && mkdir -p /tmp/P1/compile-cache && cp $R/gpu.bin /tmp/P1/compile-cache/gpu.bin
train /tmp/P1 portable1 CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=$R/portable1.cudnn.log
train /tmp/P1 warm1 CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=$R/warm1.cudnn.log
git clone -q "$W" /tmp/P2 && mkdir -p /tmp/P2/compile-cache && cp $R/gpu.bin /tmp/P2/compile-cache/gpu.bin
train /tmp/P2 portable-threads1 TORCHINDUCTOR_COMPILE_THREADS=1
ls -la ~/.nv/ComputeCache 2>&1 | head -5 >> "$R/env.txt"; du -sh ~/.nv 2>&1 >> "$R/env.txt"
for f in $R/*.cudnn.log; do wc -c $f; done >> "$R/summary.txt"
cat "$R/summary.txt"
cd $OUT && tar czf r.tgz r && rm -rf r
