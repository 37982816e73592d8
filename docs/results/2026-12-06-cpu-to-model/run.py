import json, subprocess, sys, os
sys.path.insert(0, "/work/main/tests")
from pathlib import Path
from helpers import write_params, train_command
from accelbench.core import phases
root = Path("/work/rep/root"); root.mkdir(parents=True, exist_ok=True)
prepared = Path("/work/rep/prepared")
variants = {"cpu": {"device": "cpu", "threads": 2}}
env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow.db"}
for trial in range(3):
    for repeats in (1, 3):
        d = root / f"r{repeats}"; d.mkdir(exist_ok=True)
        params = write_params(d, variants, epochs=3, batch_size=128, repeats=repeats, train_subset=4096, test_subset=1000)
        cmd = train_command(params, "cpu", prepared, d / "cpu.pt", d / "metrics")
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
        t = {t.stage: t for t in phases.read_all(root)}["train@cpu"]
        print(f"trial {trial} repeats {repeats}: wall {t.wall_s:.2f} s, repeats {t.repeats_s:.2f} s, to model {t.to_model_s:.2f} s", flush=True)
