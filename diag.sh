source benchmarks/gpu-host-setup.sh >/dev/null 2>&1
export ACCELBENCH_MNIST_MIRROR=$PWD/.mirror
python3 - <<'PY'
from ruamel.yaml import YAML
y=YAML(); p=y.load(open('params.yaml')); p['train']['epochs']=3; y.dump(p, open('params.yaml','w'))
PY
dvc repro prepare > $OUT/prep.log 2>&1
for v in cpu amp amp gpu_dataloader; do
  python3 -m cProfile -o /tmp/$v.prof -m accelbench.cli train $v --data data/prepared --model models/$v.pt --metrics metrics/$v --quiet >> $OUT/train.log 2>&1
  python3 - $v >> $OUT/prof-$v.txt <<'PY'
import pstats, sys
v=sys.argv[1]
s=pstats.Stats(f'/tmp/{v}.prof'); s.sort_stats('cumulative')
s.print_stats(r'accelbench/(tracking|training|build|engine|stages|checkpoint)\.py', 40)
s.print_callees(r'tracking.py:\d+\(wrapper\)')
s.print_callees(r'_start_variant_run|log_model|variant_run|_end_run|setup')
s.sort_stats('tottime'); s.print_stats(25)
PY
  cp .accelbench/timings/train@$v.json $OUT/timing-$v-$RANDOM.json
done
python3 -X importtime -c "import mlflow" 2> $OUT/imp-mlflow.txt
python3 -c "
import time; t=time.perf_counter()
import importlib.metadata as m; d=m.packages_distributions(); print('packages_distributions', len(d), time.perf_counter()-t)" >> $OUT/train.log
