"""Logs without a terminal and MLflow run status that tells the truth.

``--no-progress`` removes only the bar: the per-epoch line (loss, validation RSUM, samples/s) and, every
``train.log_every_steps`` steps, a step line stay in the log. A training killed and resumed is one MLflow run,
FINISHED, with each epoch's metrics once; a killed one that is started over is marked KILLED, and one stopped by
SIGTERM (Snakemake cancelling it, SLURM's time limit) marks itself KILLED as it stops. `xmr report`'s run lives in
an experiment of its own, apart from the training runs.
"""

import csv
import shutil
import signal
import time

import pytest
import yaml
from conftest import run_xmr, start_xmr_forked, train_cli

from xmr.core.progress import parse_line


def _rows(out):
    with open(out / "history.csv") as f:
        return list(csv.DictReader(f))


def test_no_progress_keeps_one_line_per_epoch_and_step_lines(tiny_synth, tmp_path):
    # 48 training images x 5 captions = 240 pairs, batch 16 -> 15 steps per epoch; a step line every 4 steps
    # -> steps 4, 8, 12 of each epoch
    recipe = tiny_synth.recipe("vsepp", name="vsepp_logs", train={"epochs": 2, "batch_size": 16,
                                                                  "log_every_steps": 4})
    out = tmp_path / "run"
    output = train_cli(recipe, out)
    lines = [ln for ln in output.splitlines() if ln.startswith("epoch ")]
    epoch_lines = [parse_line(ln) | {"head": ln.split()[1]} for ln in lines if "step=" not in ln]
    step_lines = [parse_line(ln) | {"head": ln.split()[1]} for ln in lines if "step=" in ln]
    assert [e["head"] for e in epoch_lines] == ["1/2", "2/2"]
    history = _rows(out)
    for line, row in zip(epoch_lines, history):
        assert abs(float(line["loss"]) - float(row["loss"])) < 1e-4
        assert abs(float(line["val_rsum"]) - float(row["val_rsum"])) < 0.051
        assert float(line["samples_per_s"]) > 0
        assert float(line["seconds"]) >= 0
    assert [(s["head"], s["step"]) for s in step_lines] == [(e, f"{k}/15") for e in ("1/2", "2/2") for k in (4, 8, 12)]
    assert all(float(s["samples_per_s"]) > 0 and s["eta"].count(":") == 2 for s in step_lines)


def _mlflow_runs(uri, experiment):
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id])


@pytest.fixture
def tracked(tiny_synth, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    recipe = tiny_synth.recipe("vsepp", name="vsepp_status", train={"epochs": 3, "batch_size": 16},
                               tracking={"enabled": True, "experiment": "status_test"})
    return uri, recipe


def test_killed_then_resumed_training_is_one_finished_run(tracked, tmp_path):
    uri, recipe = tracked
    out = tmp_path / "run"
    assert train_cli(recipe, out, kill_after_first_epoch=True) == -signal.SIGKILL
    client, runs = _mlflow_runs(uri, "status_test")
    assert [r.info.status for r in runs] == ["RUNNING"]  # what a kill leaves behind
    train_cli(recipe, out)
    client, runs = _mlflow_runs(uri, "status_test")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert (out / "mlflow_run_id").read_text().strip() == run.info.run_id
    for metric in ("val/rsum", "train/epoch_loss", "train/samples_per_s"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, metric)]
        assert sorted(steps) == [1, 2, 3], metric  # every epoch, each once
    rsum = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/rsum")}
    assert [rsum[e] for e in (1, 2, 3)] == pytest.approx([float(r["val_rsum"]) for r in _rows(out)])


def test_killed_training_started_over_is_marked_killed(tracked, tmp_path):
    uri, recipe = tracked
    out = tmp_path / "run"
    assert train_cli(recipe, out, kill_after_first_epoch=True) == -signal.SIGKILL
    _, runs = _mlflow_runs(uri, "status_test")
    killed_id = runs[0].info.run_id
    proc = run_xmr("train", "--config", recipe, "--out-dir", out, "--no-progress", "--no-resume", timeout=900)
    assert proc.returncode == 0, proc.stderr
    _, runs = _mlflow_runs(uri, "status_test")
    status = {r.info.run_id: r.info.status for r in runs}
    assert len(status) == 2 and status.pop(killed_id) == "KILLED"
    assert list(status.values()) == ["FINISHED"]


def test_sigterm_marks_the_run_killed_and_the_report_keeps_to_its_own_experiment(tiny_synth, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # 50 epochs: still training when the signal comes, whatever the machine's speed
    tiny_synth.recipe("vsepp", name="vsepp_term", train={"epochs": 50, "batch_size": 16},
                      tracking={"enabled": True, "experiment": "xmr/synth"})
    config = tmp_path / "config"
    shutil.copytree(tiny_synth.config_dir, config)
    out = tmp_path / "runs" / "synth" / "vsepp_term"
    proc = start_xmr_forked("train", "--config", config / "recipes" / "synth" / "vsepp_term.yaml",
                            "--out-dir", out, "--no-progress")
    deadline = time.time() + 600
    while not (out / "last.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.terminate()
    r = proc.wait(120)
    assert r.returncode == 128 + signal.SIGTERM and "xmr train: interrupted" in r.stderr, r.stdout + r.stderr
    client, runs = _mlflow_runs(uri, "xmr/synth")
    assert [(x.info.run_name, x.info.status) for x in runs] == [("vsepp_term", "KILLED")]
    assert runs[0].info.end_time is not None

    # the report of that dataset (its training curves): one `report` run, in xmr/synth/reports
    (config / "report.yaml").write_text(yaml.safe_dump({"default": {
        "methods": ["vsepp_term"], "rerank": ["none"], "experiments": [], "fr_grid": {"recipes": []},
        "examples": {"recipe": None, "queries": 1, "top_k": 3, "seed": 0},
        "subembeddings": {"recipes": [], "images": 1, "seed": 0}, "readme": [],
        "results_page": {"path": "docs/results_{dataset}.md", "parts": []}, "doc_sections": {}, "curves": True,
        "mlflow": True}}))
    rep = run_xmr("report", "--dataset", "synth", "--out-dir", tmp_path / "reports", "--config-dir", config,
                  "--runs-root", tmp_path / "runs", "--results-root", tmp_path / "results")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "(experiment xmr/synth/reports, run 'report')" in rep.stdout
    client, runs = _mlflow_runs(uri, "xmr/synth")
    assert [(x.info.run_name, x.info.status) for x in runs] == [("vsepp_term", "KILLED")]
    _, reports = _mlflow_runs(uri, "xmr/synth/reports")
    assert [x.info.run_name for x in reports] == ["report"]
    # where the UI shows each runs table (MLflow 3 opens on its GenAI pages otherwise)
    ids = {e.name: e.experiment_id for e in client.search_experiments()}
    shown = run_xmr("mlflow-server", "--print-command", "--backend-store-uri", uri, "--port", "5123")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1] == "runs tables:" and sorted(lines[2:]) == sorted(
        f"  {name}: http://127.0.0.1:5123/#/experiments/{ids[name]}/runs?workflowType=machine_learning"
        for name in ("xmr/synth", "xmr/synth/reports"))


def test_an_interrupted_evaluation_leaves_its_training_run_as_it_was(tmp_path, monkeypatch):
    """`xmr test` reopens the training's run to log the test metrics; stopped there, the run keeps its status (a
    finished training stays FINISHED), while a training stopped the same way is KILLED."""
    from xmr.run.tracking import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = Tracker(True)
    with tracker.run("xmr/synth", "trained"):
        finished = tracker.run_id
    with pytest.raises(KeyboardInterrupt):
        with tracker.run("xmr/synth", "trained", run_id=finished):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        with tracker.run("xmr/synth", "stopped", id_file=tmp_path / "mlflow_run_id"):
            raise KeyboardInterrupt
    stopped = (tmp_path / "mlflow_run_id").read_text().strip()
    assert (tracker.status(finished), tracker.status(stopped)) == ("FINISHED", "KILLED")


def test_line_log_reports_progress_and_throughput_without_a_bar(capsys):
    """What extraction logs with --no-progress: a line every `every` batches, the throughput at the end."""
    from xmr.core.progress import bar

    log = bar(total=10, initial=2, desc="extract synth/train", unit="img", progress=False, every=2)
    for _ in range(4):  # 4 batches of 2 images after 2 already done (a resumed extraction)
        log.update(2)
    log.close()
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split()[:2] for ln in lines] == [["extract", "synth/train"]] * 3
    fields = [parse_line(ln) for ln in lines]
    assert [f["done"] for f in fields] == ["6/10", "10/10", "10/10"]
    assert "eta" in fields[0] and "seconds" in fields[2] and float(fields[2]["img_per_s"]) > 0


def test_an_rsum_below_100_is_printed_with_one_decimal_like_one_above():
    """The epoch line printed `val_rsum=99.4400` for an RSUM under 100 and `val_rsum=113.1` above it; a loss
    keeps its four decimals."""
    from xmr.core.progress import log_line

    line = log_line("epoch 1/3", loss=53.54891, val_rsum=99.44, samples_per_s=650.51)
    assert line == "epoch 1/3 loss=53.5489 val_rsum=99.4 samples_per_s=650.5"
