T0=$(date +%s)
source benchmarks/gpu-host-setup.sh >/dev/null 2>&1
export ACCELBENCH_MNIST_MIRROR=$PWD/.mirror
mkdir -p /tmp/o
echo "setup $(( $(date +%s) - T0 )) s" > /tmp/o/times.txt
nvidia-smi --query-gpu=name,driver_version --format=csv >> /tmp/o/times.txt
T1=$(date +%s); dvc repro > /tmp/o/repro1.log 2>&1; echo "repro1 rc=$? $(( $(date +%s) - T1 )) s" >> /tmp/o/times.txt
accelbench runs > /tmp/o/runs.md 2>&1
tar czf /tmp/o/results1.tgz reports env metrics dvc.lock .accelbench/timings
tar czf $OUT/store.tgz mlflow.db mlartifacts
T2=$(date +%s); dvc repro -f -s train@gpu train@amp evaluate@gpu evaluate@amp quantize@gpu quantize@amp compare > /tmp/o/repro2.log 2>&1; echo "repro2 (warm compile cache) rc=$? $(( $(date +%s) - T2 )) s" >> /tmp/o/times.txt
tar czf /tmp/o/results2.tgz reports metrics .accelbench/timings
timeout 60 python3 benchmarks/variants.py cpu --epochs 2 --set cpu.threads=8 > /tmp/o/cpu8.txt 2>&1
echo "total $(( $(date +%s) - T0 )) s" >> /tmp/o/times.txt
tar czf $OUT/out.tgz -C /tmp/o .
cat /tmp/o/times.txt
