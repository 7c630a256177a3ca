"""MLflow tracking against a real store: what a run carries, the results table rebuilt from MLflow alone,
concurrent first use of one SQLite store, and a sweep of two concurrent trainings nested under a parent run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest

from xmr.cli import main
from xmr.run.config import load_run_config
from xmr.report.tables import result_rows
from xmr.run.results import evaluate_run, write_results
from xmr.train.trainer import train
from xmr.inference.model import score_split

from conftest import run_xmr, start_xmr_forked, xmr_env

from .helpers import REPO, stop_group

pytestmark = pytest.mark.integration


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("XMR_PARENT_RUN_ID", raising=False)
    return uri


def evaluate(run_dir: Path, out: Path, rerank: str | None = None) -> Path:
    """`xmr score` + `xmr test` in process: results JSON, test metrics logged to the training run."""
    sims_path = run_dir / "test_sims.npy"
    if not sims_path.exists():
        sims, _ = score_split(run_dir, progress=False)
        np.save(sims_path, sims)
    write_results(evaluate_run(run_dir, sims_path, rerank=rerank), out)
    return out


def table(capsys, *args: str) -> list[dict]:
    capsys.readouterr()
    assert main(["mlflow-table", "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def finish(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Outputs of processes started with start_new_session=True; any still running at the end is stopped."""
    try:
        return [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                stop_group(p)


def sha256_prefix(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def test_run_carries_provenance_and_table_rebuilds_from_mlflow_alone(tiny_synth, tmp_path, store, capsys):
    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_tab", tracking={"enabled": True},
                                            optim={"lr": 0.0007}))
    run_dir = tmp_path / "runs" / "vsepp_tab"
    summary = train(cfg, run_dir, progress=False)
    plain = evaluate(run_dir, tmp_path / "results" / "vsepp_tab.json")
    reranked = evaluate(run_dir, tmp_path / "results" / "vsepp_tab_fr.json", rerank="fr")

    client = mlflow.MlflowClient(store)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.run_name == "vsepp_tab"
    tags = run.data.tags
    # a commit of this repository (HEAD at training time; HEAD may move while the test runs)
    assert re.fullmatch(r"[0-9a-f]{40}", tags["git_commit"])
    assert subprocess.run(["git", "cat-file", "-e", tags["git_commit"] + "^{commit}"], cwd=REPO).returncode == 0
    feats = Path(cfg["features"]["dir"]) / "synth" / "efficientnet_lite0" / "train.h5"
    assert tags["features_sha256"] == sha256_prefix(feats)
    assert (tags["recipe"], tags["method"], tags["dataset"]) == ("vsepp_tab", "vsepp", "synth")
    assert run.data.params["optim.lr"] == "0.0007" and run.data.params["model.embed_dim"] == "32"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config.yaml", "history.csv"}
    # its artifacts lie beside the store, not under the working directory (the repository, here)
    artifacts = tmp_path / "mlruns" / run.info.experiment_id / run.info.run_id / "artifacts"
    assert Path(run.info.artifact_uri.removeprefix("file://")) == artifacts
    assert (artifacts / "config.yaml").is_file() and (artifacts / "history.csv").is_file()
    assert not (Path.cwd() / "mlruns" / run.info.experiment_id / run.info.run_id).exists()

    # the table from MLflow equals the one built from the results files (xmr summarize's rows)
    rows = table(capsys, "--experiment", "xmr/synth")
    assert [(r["target"], r["protocol"]) for r in rows] == [("vsepp_tab", "plain"), ("vsepp_tab_fr", "plain")]
    for row, path in zip(rows, (plain, reranked)):
        (expected,) = result_rows([path])
        for col in ("i2t R@1", "i2t R@5", "i2t R@10", "t2i R@1", "t2i R@5", "t2i R@10", "RSUM",
                    "i2t mAP@R (ext.)", "t2i mAP@R (ext.)"):  # the last two: synth's extended positives
            assert row[col] == pytest.approx(expected[col], abs=1e-9), col
        for col in ("epochs", "ended by", "test sim. std"):  # what `xmr show` prints beside the metrics
            assert row[col] == expected[col] and expected[col] is not None, (col, row[col], expected[col])
        assert row["run_id"] == summary["mlflow_run_id"]

    # a newer run of the recipe (a retraining) replaces it in the table; --all-runs keeps the old one
    newer = client.create_run(run.info.experiment_id, run_name="vsepp_tab", tags={"recipe": "vsepp_tab"})
    client.log_metric(newer.info.run_id, "test_plain/plain/rsum", 123.0)
    client.set_terminated(newer.info.run_id)
    rows = table(capsys, "--experiment", "xmr/synth")
    assert [(r["run_id"], r["RSUM"], r["i2t R@1"]) for r in rows] == [(newer.info.run_id, 123.0, None)]
    assert len(table(capsys, "--experiment", "xmr/synth", "--all-runs")) == 3

    assert main(["mlflow-table", "--experiment", "xmr/none"]) == 2  # a missing experiment is a one-line error
    assert "xmr/none" in capsys.readouterr().err


def test_training_into_a_deleted_experiment_is_one_line_whose_command_restores_it(tiny_synth, tmp_path, store):
    # MLflow refuses runs in a deleted experiment; the error names it and the command that restores it, which works
    # as printed (run from any folder), and the next training then lands in the restored experiment
    recipe = tiny_synth.recipe("vsepp", name="vsepp_del", tracking={"enabled": True})
    from xmr.run.tracking import experiment_id

    client = mlflow.MlflowClient(store)
    exp_id = experiment_id("xmr/synth", store)  # as a training creates it: its artifacts beside the store
    client.delete_experiment(exp_id)
    r = run_xmr("train", "--config", recipe, "--out-dir", tmp_path / "run", "--no-progress")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    restore = f"MLFLOW_TRACKING_URI={store} mlflow experiments restore --experiment-id {exp_id}"
    assert line == (f"xmr train: error: MLflow experiment 'xmr/synth' in {store} is deleted: restore it "
                    f"(`{restore}`), or set tracking.experiment to another name"), line
    assert not (tmp_path / "run" / "best.pt").exists()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the printed line says which store
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    subprocess.run(["bash", "-c", restore], cwd=tmp_path / "..", env=env, check=True, capture_output=True)
    r = run_xmr("train", "--config", recipe, "--out-dir", tmp_path / "run", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    (run,) = client.search_runs([exp_id])
    assert run.info.run_name == "vsepp_del" and run.info.status == "FINISHED"
    assert run.info.artifact_uri.removeprefix("file://").startswith(str(tmp_path / "mlruns"))


RACE = """
import os, sys, time
from pathlib import Path
import mlflow
from xmr.run.tracking import Tracker
Path(sys.argv[1] + "." + sys.argv[2]).touch()  # imported: ready
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.01)
tracker = Tracker(True)
with tracker.run("xmr/synth", sys.argv[2], tags={"recipe": sys.argv[2]}):
    for step in range(20):
        tracker.log_metrics({"val/rsum": float(step)}, step=step)
"""


def test_concurrent_first_use_of_one_sqlite_store(tmp_path, store):
    """Three processes open a new SQLite store at the same instant. Without xmr.run.tracking.store_lock MLflow's
    schema migrations race ("table metrics already exists", "duplicate column name: step"): in each of 5 tries
    on this machine, 2 of the 3 processes crashed. With it, every run and every metric point lands."""
    go = tmp_path / "go"
    env = dict(os.environ, MLFLOW_TRACKING_URI=store, MLFLOW_ENABLE_TELEMETRY="false")
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(go), f"job{i}"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for i in range(3)]
    deadline = time.time() + 240
    while not all(Path(f"{go}.job{i}").exists() for i in range(3)) and time.time() < deadline:
        time.sleep(0.05)  # until all three are past their imports and polling for the start signal
    go.touch()
    outs = finish(procs, timeout=300)
    assert [p.returncode for p in procs] == [0] * 3, "\n".join(o[-2000:] for o in outs)
    client = mlflow.MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("xmr/synth").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["job0", "job1", "job2"]
    for r in runs:
        assert [m.value for m in client.get_metric_history(r.info.run_id, "val/rsum")] == list(map(float, range(20)))


def test_sweep_of_two_concurrent_trainings_nests_under_a_parent(tiny_synth, tmp_path, store, capsys):
    """A learning-rate sweep: a parent run, two `xmr train` processes at once on one new SQLite store, each
    nested under the parent through $XMR_PARENT_RUN_ID; the table lists both children."""
    recipe = tiny_synth.recipe("vsepp", name="vsepp_sweep", tracking={"enabled": True}, train={"epochs": 2})
    client = mlflow.MlflowClient(store)
    from xmr.run.tracking import prepare_store

    exp_id = prepare_store("xmr/synth", store)
    parent = client.create_run(exp_id, run_name="lr_sweep").info.run_id
    lrs = ("0.001", "0.0001")
    procs = [start_xmr_forked("train", "--config", recipe, "--out-dir", tmp_path / f"lr{lr}", "--set",
                              f"optim.lr={lr}", f"tracking.run_name=lr{lr}", "--no-progress", cwd=REPO,
                              env=xmr_env(MLFLOW_TRACKING_URI=store, XMR_PARENT_RUN_ID=parent)) for lr in lrs]
    done = [p.wait(timeout=600) for p in procs]
    assert [r.returncode for r in done] == [0, 0], "\n".join((r.stdout + r.stderr)[-2000:] for r in done)
    client.set_terminated(parent)

    children = client.search_runs([exp_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted((r.info.run_name, r.data.params["optim.lr"]) for r in children) == [
        ("lr0.0001", "0.0001"), ("lr0.001", "0.001")]
    for r in children:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "val/rsum")] == [1, 2]
        evaluate(tmp_path / f"lr{r.data.params['optim.lr']}", tmp_path / f"{r.info.run_name}.json")
    rows = table(capsys, "--experiment", "xmr/synth")
    assert sorted((r["run_name"], r["parent_run_id"]) for r in rows) == [("lr0.0001", parent), ("lr0.001", parent)]
    assert {r["target"] for r in rows} == {"vsepp_sweep"}
