"""MLflow behind one narrow port: what the stages call to track a variant's run.

A stage starts, resumes or skips a variant's run, logs into it, and compare finishes the
pipeline run; tracking that is down costs one warning line, never an output (`outage.py`).
The rest has a room of its own: the store and its lock (`store.py`), the pipeline and variant
runs (`runs.py`), what they hold (`logs.py`), closing the runs of dead processes
(`dead_runs.py`), the UI's view and links (`view.py`), and a DVC experiment shown beside its
baseline (`baseline.py`, which compare alone calls).
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
