set -x
T0=$(date +%s)
source benchmarks/gpu-host-setup.sh
export ACCELBENCH_MNIST_MIRROR=$PWD/.mirror
echo "setup $(( $(date +%s) - T0 )) s"; nproc; python3 -c "import torch; print(torch.__version__, torch.get_num_threads())"
python3 -X importtime -c "import accelbench.training" 2> $OUT/importtime.txt
T1=$(date +%s); /usr/bin/time -v dvc repro > $OUT/repro1.log 2>&1; echo "repro1 $(( $(date +%s) - T1 )) s"
cp reports/comparison.md $OUT/comparison1.md; cp -r .accelbench/timings $OUT/timings1; cp reports/pipeline_time.json $OUT/pt1.json
T2=$(date +%s); dvc repro -f -s train@amp train@gpu evaluate@amp evaluate@gpu compare > $OUT/repro2.log 2>&1; echo "repro2 (warm compile cache) $(( $(date +%s) - T2 )) s"
cp reports/comparison.md $OUT/comparison2.md; cp -r .accelbench/timings $OUT/timings2
timeout 120 python3 benchmarks/variants.py amp gpu --epochs 3 --set amp.channels_last=false --set gpu.channels_last=false > $OUT/nocl.txt 2>&1
timeout 100 python3 benchmarks/variants.py cpu --epochs 2 --set cpu.threads=$(nproc) > $OUT/cputhreads.txt 2>&1
tar czf $OUT/store.tgz mlflow.db mlartifacts metrics reports dvc.lock 2>/dev/null
echo total $(( $(date +%s) - T0 )) s
