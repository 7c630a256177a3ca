"""DDP: the SLURM -> torchrun environment mapping, the launcher's command lines, and a real 2-process CPU (gloo)
training started by torchrun that writes one set of outputs and one MLflow run."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys

import pytest

from xmr.core.errors import XmrError
from xmr.train import distributed


def test_expand_nodelist_matches_scontrol_show_hostnames():
    # what `scontrol show hostnames` prints for these lists, written out by hand
    assert distributed.expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert distributed.expand_nodelist("node7") == ["node7"]
    assert distributed.expand_nodelist("a,b") == ["a", "b"]
    assert distributed.expand_nodelist("n[9-11]") == ["n9", "n10", "n11"]


def test_slurm_env_maps_to_torchrun_env(monkeypatch):
    # set-then-delete records each variable's original state, so the ones the mapping writes into os.environ
    # are removed again after the test (a leaked WORLD_SIZE would make later trainings wait for peers)
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_STEP_ID"):
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_NTASKS", "8")
    distributed._env_from_slurm()  # the batch script of an sbatch --ntasks=8 job: one process, no mapping
    assert "WORLD_SIZE" not in os.environ
    monkeypatch.setenv("SLURM_STEP_ID", "0")  # task 5 of an srun step
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[04-05]")
    distributed._env_from_slurm()
    assert (os.environ["WORLD_SIZE"], os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("8", "5", "1")
    assert os.environ["MASTER_ADDR"] == "gpu04"
    assert os.environ["MASTER_PORT"] == str(29500 + 123456 % 1000)  # 29956


def test_already_launched_and_launcher_choice(monkeypatch):
    assert not distributed.already_launched({})
    assert not distributed.already_launched({"SLURM_JOB_ID": "3", "SLURM_NTASKS": "4"})  # the batch step itself
    assert distributed.already_launched({distributed.CHILD_ENV: "1"})
    assert distributed.already_launched({"WORLD_SIZE": "2"})
    assert distributed.already_launched({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"})  # a hand-written srun -n 4
    monkeypatch.setattr(distributed.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert distributed.resolve_launcher("auto", {"SLURM_JOB_ID": "3"}) == "srun"
    assert distributed.resolve_launcher("auto", {}) == "torchrun"
    monkeypatch.setattr(distributed.shutil, "which", lambda name: None)
    assert distributed.resolve_launcher("auto", {"SLURM_JOB_ID": "3"}) == "torchrun"
    with pytest.raises(XmrError, match="--launcher mpirun"):
        distributed.resolve_launcher("mpirun")


def test_launch_commands():
    args = ["train", "--config", "c.yaml", "--out-dir", "runs/x"]
    assert distributed.launch_command(args, 4, 2, "srun", cpus_per_task=8, python="py") == [
        "srun", "--ntasks=8", "--nodes=2", "--ntasks-per-node=4", "--cpus-per-task=8", "--kill-on-bad-exit=1",
        "py", "-m", "xmr", *args]
    assert distributed.launch_command(args, 2, 1, "torchrun", python="py") == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "xmr", *args]
    with pytest.raises(XmrError, match="needs SLURM"):
        distributed.launch_command(args, 2, 2, "torchrun")
    with pytest.raises(XmrError, match=">= 1"):
        distributed.launch_command(args, 0, 1, "torchrun")


def _from_main_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    ctx = distributed.setup()
    calls = []
    got = ctx.from_main(lambda: calls.append(rank) or {"digest": f"rank{rank}", "rank": rank})
    with open(f"{out}.rank{rank}", "w") as f:
        f.write(f"{calls} {got['digest']}")
    distributed.cleanup(ctx)


def test_from_main_computes_on_rank_0_only_and_every_rank_gets_its_result(tmp_path):
    """The trainer hashes the training store with ``from_main``: one read, not one per process."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "from_main")
    mp.spawn(_from_main_worker, args=(2, port, out), nprocs=2, join=True)
    assert [open(f"{out}.rank{r}").read() for r in range(2)] == ["[0] rank0", "[] rank0"]
    assert distributed.DistContext().from_main(lambda: 7) == 7  # one process: just calls it


def _launch_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables (the test starts its own), one thread per process."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    for key in (distributed.CHILD_ENV, "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                "XMR_RUN_LOCK_HELD"):
        env.pop(key, None)
    return env


@contextlib.contextmanager
def _process_group(cmd: list[str], env: dict[str, str], cwd):
    """``cmd`` started in its own process group (a hang stops torchrun's workers too), killed with it if still
    running at the end."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_torchrun_two_cpu_processes_write_one_set_of_outputs(tiny_synth, tmp_path):
    """``torchrun --standalone --nproc_per_node=2 -m xmr train``: gloo DDP on CPU, 2 epochs. Rank 0 alone writes
    the run directory and logs one MLflow run; each process sees half of the pairs per epoch."""
    import mlflow

    # gather_negatives: the loss of each step sees both processes' pairs (the gradient is checked in test_samplers)
    recipe = tiny_synth.recipe("vsepp", name="vsepp_ddp", train={"epochs": 2, "log_every": 1,
                                                                  "gather_negatives": True},
                               tracking={"enabled": True})
    out = tmp_path / "run"
    db = tmp_path / "mlflow.db"
    env = _launch_env(MLFLOW_TRACKING_URI=f"sqlite:///{db}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "xmr", "train", "--config", str(recipe), "--out-dir", str(out), "--no-progress"]
    with _process_group(cmd, env, tmp_path) as proc:
        printed, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, printed[-5000:]
    # (mlflow_run_id: the run id of this training's attempts, written by rank 0 only; docs/tracking.md)
    assert sorted(p.name for p in out.iterdir()) == ["best.pt", "config.yaml", "history.csv", "last.pt",
                                                     "mlflow_run_id", "progress.json", "train.json"]
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [1, 2]

    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("xmr/synth")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "vsepp_ddp"
    assert runs[0].data.tags["world_size"] == "2"
    # 48 training images x 5 captions = 240 pairs -> 120 per process; batches of 16 with drop_last -> 7 steps
    # per epoch (a single process would take 15), logged every step by rank 0 only (a second logger would
    # repeat each step)
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")]
    assert steps == list(range(1, 2 * 7 + 1))


def test_xmr_train_launcher_holds_the_one_run_lock(tiny_synth, tmp_path):
    """``xmr train --nproc-per-node 2``: the launcher takes the run's lock and its children (rank 0 included) take
    none, so the training runs; a second launcher on the same live run stops before starting any process."""
    recipe = tiny_synth.recipe("vsepp", name="vsepp_ddp_lock")
    out = tmp_path / "run"
    env = _launch_env()
    cmd = [sys.executable, "-m", "xmr", "train", "--config", str(recipe), "--out-dir", str(out), "--no-progress",
           "--nproc-per-node", "2", "--launcher", "torchrun"]
    with _process_group(cmd, env, tmp_path) as first:
        assert first.stdout.readline().startswith("launching:")  # printed once the launcher holds the lock
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert second.returncode == 2 and "launching" not in second.stdout
        assert f"pid {first.pid} " in second.stderr and len(second.stderr.strip().splitlines()) == 1
        printed, _ = first.communicate(timeout=600)
    assert first.returncode == 0, printed[-5000:]
    assert (out / "train.json").exists() and not (out / "train.lock").exists()
