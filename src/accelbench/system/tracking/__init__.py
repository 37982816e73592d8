"""MLflow behind one narrow port: what the stages call to track a variant's run. Tracking
that is down costs one warning line, never an output (`outage.py`); the store (`store.py`),
the runs (`runs.py`, `dead_runs.py`), what they hold (`logs.py`) and the UI's view
(`view.py`, `baseline.py`) have a room each.
"""

from accelbench.system.tracking.logs import (
    catch_up,
    log_artifact,
    log_dataset,
    log_evaluation,
    log_metrics,
    log_model,
    log_variant_figures,
)
from accelbench.system.tracking.runs import finish_pipeline, record_skipped, resume_run, variant_run

__all__ = [
    "catch_up",
    "finish_pipeline",
    "log_artifact",
    "log_dataset",
    "log_evaluation",
    "log_metrics",
    "log_model",
    "log_variant_figures",
    "record_skipped",
    "resume_run",
    "variant_run",
]
