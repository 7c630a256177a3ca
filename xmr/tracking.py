"""MLflow tracking: one experiment per dataset (``xmr/{dataset}``), one run per trained recipe.

The store is ``$MLFLOW_TRACKING_URI`` when set (a ``mlflow server`` on a cluster), else ``sqlite:///mlflow.db``
in the working directory (MLflow >= 3.13 refuses the old ``./mlruns`` file store).
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from typing import Any, Iterator

DEFAULT_URI = "sqlite:///mlflow.db"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def metrics_to_flat(metrics: dict, prefix: str) -> dict[str, float]:
    """``{"i2t": {"r1": ..}, "rsum": ..}`` -> ``{prefix/i2t_r1: .., prefix/rsum: ..}`` (numbers only)."""
    flat = {}
    for k, v in flatten({k: v for k, v in metrics.items() if k != "folds"}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            flat[f"{prefix}/{k.replace('.', '_')}"] = float(v)
    return flat


class Tracker:
    """Thin wrapper so training code does not care whether tracking is on."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.run_id: str | None = None
        if enabled:
            import mlflow

            mlflow.set_tracking_uri(tracking_uri())
            self.mlflow = mlflow

    @contextmanager
    def run(self, experiment: str, run_name: str, run_id: str | None = None, tags: dict | None = None,
            parent_run_id: str | None = None) -> Iterator["Tracker"]:
        if not self.enabled:
            yield self
            return
        mlflow = self.mlflow
        mlflow.set_experiment(experiment)
        kwargs: dict[str, Any] = {"run_id": run_id} if run_id else {"run_name": run_name}
        if parent_run_id and not run_id:
            kwargs.update(nested=True, parent_run_id=parent_run_id)
        with mlflow.start_run(**kwargs) as active:
            self.run_id = active.info.run_id
            if tags:
                mlflow.set_tags({k: str(v) for k, v in tags.items()})
            yield self

    def log_params(self, params: dict) -> None:
        if self.enabled:
            flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
            items = list(flat.items())
            for i in range(0, len(items), 100):
                self.mlflow.log_params(dict(items[i : i + 100]))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.enabled and metrics:
            self.mlflow.log_metrics(metrics, step=step)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        if self.enabled and os.path.exists(path):
            self.mlflow.log_artifact(path, artifact_path)

    def log_dict(self, obj: dict, name: str) -> None:
        if self.enabled:
            self.mlflow.log_dict(obj, name)

    def set_tags(self, tags: dict) -> None:
        if self.enabled:
            self.mlflow.set_tags({k: str(v) for k, v in tags.items()})
