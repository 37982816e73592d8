import json, os, re, statistics as st, subprocess, sys, tempfile, time
from pathlib import Path
def med(xs): xs = sorted(xs); return f"{st.median(xs):.2f} s [{xs[0]:.2f}-{xs[-1]:.2f}]"
MODS = ["torch", "mlflow", "mlflow.store.tracking.sqlalchemy_store", "accelbench.training.loop", "accelbench.stages.compare"]
cum = {m: [] for m in MODS}
for _ in range(3):
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "; ".join(f"import {m}" for m in MODS)], capture_output=True, text=True).stderr
    for m in MODS:
        hit = re.findall(rf"\|\s+(\d+) \|\s*{re.escape(m)}$", err, re.M); cum[m].append(int(hit[-1]) / 1e6 if hit else 0.0)
for m in MODS: print(f"import {m:40s} {med(cum[m])}  (after the ones above)")
SEQ = r'''
import json, os, sys, time; T = {}; t = time.perf_counter()
def mark(k):
    global t; n = time.perf_counter(); T[k] = round(n - t, 3); t = n
import numpy as np, torch; mark("import_torch")
from pathlib import Path
from accelbench.system import tracking; mark("import_mlflow")
from accelbench.training.models import for_dataset
from accelbench.data.datasets import DATASETS
root = Path(sys.argv[1]); t = time.perf_counter()
tracking.setup(root); mark("store_setup")
with tracking.variant_run(root, "probe", {"a": 1}, {"status": "trained"}, system_metrics=True):
    mark("start_run_system_metrics")
    for e in range(10): tracking.log_metrics({"loss": 0.1, "acc": 0.9, "s": 1.0}, step=e)
    mark("log_metrics_x10")
    model = for_dataset(DATASETS["mnist"]).eval(); x = np.zeros((2, 1, 28, 28), np.float32)
    if os.environ.get("SCAN") == "1": tracking._no_distribution_scan = __import__("contextlib").nullcontext
    tracking.log_model(model, x, "probe"); mark("log_model")
mark("end_run")
import importlib.metadata as md
s = time.perf_counter(); n = len(list(md.distributions())); md.packages_distributions(); T["packages_distributions"] = round(time.perf_counter() - s, 3); T["distributions"] = n
print(json.dumps(T)); sys.stdout.flush()
open(sys.argv[2], "w").write(str(time.time()))
'''
work = Path(tempfile.mkdtemp(prefix="probe-", dir="."))
env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work.resolve()}/mlflow.db", "MLFLOW_DISABLE_TELEMETRY": "true"}
rows, teardown = {"0": [], "1": []}, []
for i in range(4):
    scan = str(i % 2)
    out = subprocess.run([sys.executable, "-c", SEQ, str(work), str(work / "t")], capture_output=True, text=True, env={**env, "SCAN": scan}); end = time.time()
    if out.returncode: print(out.stderr[-2000:]); break
    rows[scan].append(json.loads(out.stdout.strip().splitlines()[-1])); teardown.append(end - float((work / "t").read_text()))
print(f"distributions installed: {rows['0'][0].pop('distributions')}"); [r.pop("distributions", None) for v in rows.values() for r in v]
for k in rows["0"][0]:
    print(f"{k:28s} " + " | ".join(f"{'with scan' if s == '1' else 'no scan  '} {med([r[k] for r in rows[s]])}" for s in "01" if rows[s]))
print(f"{'interpreter exit (teardown)':28s} {med(teardown)}")
fd = os.open(work / "f", os.O_WRONLY | os.O_CREAT); lat = []
for _ in range(50):
    os.write(fd, b"x" * 4096); s = time.perf_counter(); os.fdatasync(fd); lat.append(time.perf_counter() - s)
os.close(fd); print(f"fdatasync on the checkout's disk: median {1e3 * st.median(lat):.2f} ms, max {1e3 * max(lat):.2f} ms")
subprocess.run(["rm", "-rf", str(work)])
