"""8 trainings at once logging to one MLflow store, the default SQLite file and `xmr mlflow-server` (docs/faults.md):
no run and no metric is lost, and no "database is locked" reaches the user (xmr.run.tracking.retry_locked)."""

from __future__ import annotations

import contextlib

import mlflow
import pytest

from conftest import start_xmr_forked, xmr_env

from .helpers import REPO
from .test_mlflow_ui import mlflow_server

pytestmark = pytest.mark.integration

N_RUNS, EPOCHS = 8, 2


@pytest.mark.parametrize("kind", ["sqlite", "server"])
def test_eight_concurrent_trainings_on_one_store(tiny_synth, tmp_path, kind):
    with contextlib.ExitStack() as stack:
        store = (f"sqlite:///{tmp_path / 'mlflow.db'}" if kind == "sqlite"
                 else stack.enter_context(mlflow_server(tmp_path))[0])
        _eight_trainings(tiny_synth, tmp_path, store)


def _eight_trainings(tiny_synth, tmp_path, store: str) -> None:
    recipe = tiny_synth.recipe("vsepp", name="vsepp_concurrent", tracking={"enabled": True},
                               train={"epochs": EPOCHS, "log_every": 1})
    # eight processes, each forked from a server that has imported torch, MLflow and xmr (no 5 s of imports each)
    procs = [start_xmr_forked("train", "--config", recipe, "--out-dir", tmp_path / f"run{i}", "--set",
                              f"tracking.run_name=run{i}", "--no-progress", cwd=REPO,
                              env=xmr_env(MLFLOW_TRACKING_URI=store)) for i in range(N_RUNS)]
    try:
        done = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outs = [r.stdout + r.stderr for r in done]
    assert [r.returncode for r in done] == [0] * N_RUNS, "\n".join(o[-2000:] for o in outs)
    assert not any("database is locked" in o for o in outs)
    client = mlflow.MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("xmr/synth").experiment_id])
    assert sorted(r.info.run_name for r in runs) == sorted(f"run{i}" for i in range(N_RUNS))
    steps = None
    for r in runs:
        assert r.info.status == "FINISHED", (r.info.run_name, r.info.status)
        assert [m.step for m in client.get_metric_history(r.info.run_id, "val/rsum")] == list(range(1, EPOCHS + 1))
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/epoch_loss")] == \
            list(range(1, EPOCHS + 1))
        train_steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        assert train_steps == sorted(set(train_steps)) and train_steps[0] == 1  # every step, once, in order
        steps = steps or train_steps
        assert train_steps == steps  # same recipe: the same number of logged steps in every run
