"""The shipped SLURM profile (slurm/profile.yaml) against a real one-node SLURM on localhost.

tests/slurm/setup_local_slurm.sh installs Debian's slurm-wlm + munge and starts munged, slurmctld and slurmd
(no accounting database). The profile is used unchanged; the test adds only test-side flags: job status from
squeue (no slurmdbd here, docs/pipeline.md), a short first status check, and keeping the executor's job logs;
and it caps the executor's wait between status rounds (SNAKEMAKE_POLL_CAPPED).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import yaml

from .helpers import BIN, REPO, copy_repo, free_port, make_tiny, run, stop_group, tool_env

pytestmark = pytest.mark.integration

SETUP = REPO / "tests" / "slurm" / "setup_local_slurm.sh"
TARGET = "results/synth/vsepp.json"
# The SLURM executor adds 10 s to its wait after each status round in which no job finished (up to 180 s): made
# for busy clusters, on this idle one-node one it was most of the pipeline's 110 s. Snakemake's own entry point,
# with that one wait capped at 2 s; submission, resources and results are untouched.
SNAKEMAKE_POLL_CAPPED = [
    str(BIN / "python"), "-c",
    "import sys; import snakemake_executor_plugin_slurm as slurm; "
    "from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor; "
    "wait = RemoteExecutor.next_seconds_between_status_checks; "
    "slurm.Executor.next_seconds_between_status_checks = property(wait.fget, lambda ex, s: wait.fset(ex, min(s, 2))); "
    "from snakemake.cli import main; sys.argv[0] = 'snakemake'; sys.exit(main())",
]
TEST_FLAGS = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
              "--slurm-keep-successful-logs"]


def _start_cluster(state: Path) -> None:
    env = dict(os.environ, XMR_SLURMCTLD_PORT=str(free_port()), XMR_SLURMD_PORT=str(free_port()))
    proc = subprocess.run(["bash", str(SETUP), "start", str(state)], env=env, capture_output=True, text=True,
                          timeout=420)
    if proc.returncode == 77:  # the script's "this machine cannot host a cluster" (not root, no apt-get)
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@contextmanager
def machine_lock(timeout: float = 1800) -> Iterator[None]:
    """One test cluster per machine at a time: slurmd's config cache (/run/slurm/conf), which the clients
    read, is machine-wide, so a second pytest session (say `make test` beside a single test) waits here."""
    import fcntl

    with open(Path(tempfile.gettempdir()) / "xmr-test-slurm.lock", "w") as fh:
        deadline = time.time() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.time() < deadline, "another test SLURM cluster held the machine for 30 min"
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def local_slurm(module_tmp):
    state = module_tmp("slurm")
    with machine_lock():
        try:
            _start_cluster(state)
            yield state
        finally:
            subprocess.run(["bash", str(SETUP), "stop", str(state)], timeout=60)


def jobcomp_records(state: Path) -> dict[str, dict[str, str]]:
    """JobId -> fields of SLURM's job completion log (jobcomp/filetxt: `Key=Value` pairs per line)."""
    records = {}
    path = state / "jobcomp.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        records[fields["JobId"]] = fields
    return records


def wait_for_job(state: Path, job_id: str, env: dict[str, str], timeout: float = 300) -> None:
    """Until SLURM's job completion log has ``job_id``: `sbatch --wait` instead polls at 2, 4, 8, 16, 32 s, which
    turned this test's 10-s job into 42 s of waiting on a loaded machine."""
    deadline = time.time() + timeout
    while job_id not in jobcomp_records(state):
        if time.time() > deadline:
            queued = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True).stdout
            raise AssertionError(f"SLURM job {job_id} not completed after {timeout:.0f} s; squeue: {queued!r}")
        time.sleep(0.5)


def test_dry_run_plans_coco_without_slurm(tmp_path):
    """`snakemake -n --profile slurm results/coco/dvse_fr.json` (the README's command): plans with the GPU-cluster resources of
    config/config.yaml (no SLURM needed); partition from $XMR_SLURM_PARTITION; several GPUs -> DDP tasks."""
    root = copy_repo(tmp_path / "repo")  # a fresh clone: no data/coco at all; rule link_dataset provides it
    # SLURM's commands shadowed by stubs that fail like a missing command and log their calls
    stubs = tmp_path / "no-slurm"
    stubs.mkdir()
    for name in ("sbatch", "srun", "squeue", "sinfo", "sacct", "scontrol", "scancel", "sacctmgr", "sshare"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {stubs}/calls.log\nexit 127\n')
        (stubs / name).chmod(0o755)
    env = tool_env(root, XMR_SLURM_PARTITION="gpu")
    env["PATH"] = f"{stubs}:{env['PATH']}"
    cmd = [str(BIN / "snakemake"), "-n", "--profile", "slurm", "results/coco/dvse_fr.json"]
    out = run(cmd, root, env, timeout=300).stdout
    calls = (stubs / "calls.log").read_text() if (stubs / "calls.log").exists() else ""
    assert "sbatch" not in calls and "srun" not in calls  # planned, nothing submitted
    assert "Using profile slurm" in out
    blocks = {m[0]: m[1] for m in re.findall(r"rule (\w+):\n(.*?)(?=\n\n|\Z)", out, flags=re.S)}
    assert set(blocks) == {"link_dataset", "extract", "train", "score", "evaluate"}  # the full COCO chain
    assert "output: data/coco/dataset_coco.json" in blocks["link_dataset"]
    assert len(re.findall(r"rule extract:", out)) == 3  # train, val, test features
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["resources"]["gpu_cluster"]  # coco's
    train = blocks["train"]
    for key in ("mem_mb", "runtime", "cpus_per_task", "gpu"):
        assert f"{key}={cfg['train'][key]}" in train, key
    assert "slurm_partition=gpu" in train and "mpi=" not in train

    # four GPUs on each of two nodes: 8 DDP tasks, gres per node, and `xmr train` starting them with srun
    (tmp_path / "multi.yaml").write_text(yaml.safe_dump({"resources": {"coco": {"train": {"gpu": 4, "nodes": 2}}}}))
    env.pop("XMR_SLURM_PARTITION")
    out = run(cmd[:-1] + ["runs/coco/dvse/best.pt", "--configfile", str(tmp_path / "multi.yaml")], root, env,
              timeout=300).stdout
    train = re.search(r"rule train:\n(.*?)(?=\n\n|\Z)", out, flags=re.S)[1]
    for item in ("gres=gpu:4", "nodes=2", "tasks=8", "tasks_per_gpu=1", "mpi=srun"):
        assert item in train, item
    assert "slurm_partition" not in train  # unset variable: no -p, the cluster's default partition
    assert "--nproc-per-node 4 --nnodes 2" in train

    # what the executor plugin makes of these resources: one task per GPU, four GPUs on each of two nodes
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Resources(dict):
        __getattr__ = dict.__getitem__

    resources = Resources((k, int(v) if v.isdigit() else v) for k, v in
                          re.findall(r"(\w+)=([^,\s]+)", re.search(r"resources: (.*)", train)[1]))
    job = SimpleNamespace(resources=resources, threads=resources["cpus_per_task"])
    sbatch = get_submit_command(job, {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "",
                                      "partition": "", "workdir": "."}) + set_gres_string(job)
    for flag in ("--nodes=2", "--ntasks=8", "--ntasks-per-gpu=1", "--gres=gpu:4", "--cpus-per-task=8",
                 "--mem 64000", "-t 2880"):
        assert flag in sbatch, (flag, sbatch)
    assert "--gpus=" not in sbatch  # --gpus counts over all nodes; gres is per node


@pytest.fixture(scope="module")
def pipelines(local_slurm, module_tmp) -> dict:
    """The synth pipeline run twice on tiny sizes: `snakemake --profile slurm` and a local `snakemake --cores 2`
    (the reference, overlapping the SLURM run, which mostly waits for status checks)."""
    tmp = module_tmp("pipelines")
    local, on_slurm = copy_repo(tmp / "local"), copy_repo(tmp / "slurm")
    for root in (local, on_slurm):
        make_tiny(root)  # config/config.yaml as shipped: one CPU per synth extraction, two side by side here
    local_proc = subprocess.Popen([str(BIN / "snakemake"), "--cores", "2", TARGET], cwd=local,
                                  env=tool_env(local), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
    env = tool_env(on_slurm, XMR_SLURM_PARTITION="debug")
    t0 = time.time()
    try:
        # ~2 min on an idle 2-core machine (7 jobs, each starting snakemake and xmr); the limit allows a busy one
        out = run([*SNAKEMAKE_POLL_CAPPED, "--profile", "slurm", TARGET, *TEST_FLAGS], on_slurm, env,
                  timeout=900).stdout
        seconds = time.time() - t0
        local_out, _ = local_proc.communicate(timeout=600)
    finally:
        if local_proc.poll() is None:
            stop_group(local_proc)
    assert local_proc.returncode == 0, local_out[-4000:]
    print(f"SLURM pipeline: {seconds:.0f} s")
    return {"state": local_slurm, "local": local, "slurm": on_slurm, "out": out, "env": env}


def test_profile_runs_synth_through_sbatch_and_matches_local(pipelines):
    state, out, env, on_slurm, local = (pipelines[k] for k in ("state", "out", "env", "slurm", "local"))

    # every rule ran as a SLURM job: submitted by the executor, completed in the debug partition
    submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", out))
    records = jobcomp_records(state)
    assert len(submitted) == 7, out[-3000:]  # synth, 3 x extract, train, score, evaluate
    for slurm_id in submitted.values():
        assert records[slurm_id]["JobState"] == "COMPLETED", records.get(slurm_id)
        assert records[slurm_id]["Partition"] == "debug"

    # the training run's MLflow tags lead back to its SLURM job, whose allocation is config/config.yaml's
    # `resources.synth.train` (mem_mb 6000 -> --mem 6000, cpus_per_task 2, runtime 60 min)
    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("xmr/synth")
    (train_run,) = client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'vsepp'")
    job = records[train_run.data.tags["slurm_job_id"]]
    assert job["Tres"].startswith("cpu=2,mem=6000M") and job["ProcCnt"] == "2"
    assert job["TimeLimit"] == "60"  # minutes
    assert list((on_slurm / "logs" / "slurm").rglob("*.log")), "the executor's per-job logs"

    # same seed, same data, same code: the SLURM results equal the local ones
    ours = json.loads((on_slurm / TARGET).read_text())
    ref = json.loads((local / TARGET).read_text())
    for direction in ("i2t", "t2i"):
        for k in ("r1", "r5", "r10"):
            assert ours[direction][k] == pytest.approx(ref[direction][k], abs=1e-6)
    assert ours["rsum"] == pytest.approx(ref["rsum"], abs=1e-6)
    np.testing.assert_allclose(np.load(on_slurm / "runs/synth/vsepp/test_sims.npy"),
                               np.load(local / "runs/synth/vsepp/test_sims.npy"), atol=1e-5)


def test_xmr_train_launches_ddp_tasks_with_srun(pipelines):
    """`xmr train --nproc-per-node 2` inside an sbatch job starts 2 tasks with srun (what the train rule runs
    when config asks for several GPUs); the tasks train as one gloo DDP run."""
    state, env, root = pipelines["state"], pipelines["env"], pipelines["slurm"]
    log = root / "ddp.log"
    job = f"{BIN / 'python'} -m xmr train --config config/recipes/synth/vsepp.yaml --out-dir runs/synth/ddp " \
          f"--set train.epochs=1 tracking.run_name=vsepp_ddp --nproc-per-node 2 --no-progress"
    job_id = run(["sbatch", "--parsable", "--ntasks=2", "--cpus-per-task=1", "--mem=4000", "-t", "10", "-o",
                  str(log), "--wrap", job], root, env).stdout.strip().split(";")[0]
    wait_for_job(state, job_id, env)
    text = log.read_text()
    assert "launching: srun --ntasks=2 --nodes=1 --ntasks-per-node=2" in text, text[-3000:]
    assert (root / "runs/synth/ddp/best.pt").exists() and (root / "runs/synth/ddp/train.json").exists()
    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    (ddp_run,) = client.search_runs([client.get_experiment_by_name("xmr/synth").experiment_id],
                                    filter_string="attributes.run_name = 'vsepp_ddp'")
    assert ddp_run.data.tags["world_size"] == "2"
    assert jobcomp_records(state)[ddp_run.data.tags["slurm_job_id"]]["JobState"] == "COMPLETED"
