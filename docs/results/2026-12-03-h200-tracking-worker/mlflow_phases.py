"""Where a train stage's MLflow time goes, call by call, in one fresh process as the stage
makes them (a new SQLite store in the checkout): python mlflow_phases.py (from the checkout,
after `dvc repro prepare`). Prints one JSON line of seconds."""

import json
import time
from pathlib import Path

marks = {}
t = time.perf_counter()


def mark(name):
    global t
    now = time.perf_counter()
    marks[name] = round(now - t, 3)
    t = now


import torch  # noqa: E402  (the stage has torch before MLflow)

mark("import torch")
import mlflow  # noqa: E402

mark("import mlflow")
from accelbench.data import prepared  # noqa: E402
from accelbench.system import tracking  # noqa: E402
from accelbench.system.tracking import store  # noqa: E402
from accelbench.training.models import SeedCNN  # noqa: E402

mark("import accelbench.system.tracking")
root = Path(".").resolve()
store.setup(root)
mark("store and experiment (setup)")
with tracking.variant_run(root, "probe", {"a": 1}, {"status": "trained"}, system_metrics=True):
    mark("start the run: params, artifacts, system metrics")
    for split, context in (("train", "training"), ("test", "evaluation")):
        arrays = prepared.load_split(root / "data/prepared", split, 0)
        digest = prepared.dataset_digest(root / "data/prepared", split, 0)
        tracking.log_dataset(
            f"mnist-{split}", arrays.images, arrays.labels, root / "data/prepared", digest, context
        )
    mark("log two datasets")
    for epoch in range(1, 11):
        tracking.log_metrics({"train_loss": 0.1, "test_accuracy": 0.99}, step=epoch)
    mark("log 10 epochs of metrics")
    example = torch.zeros(4, 1, 28, 28).numpy()
    tracking.log_model(SeedCNN().eval(), example, "probe")
    mark("log the model")
mark("end the run")
print(json.dumps(marks))
