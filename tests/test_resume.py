"""A training run killed after an epoch resumes from last.pt and ends exactly like an uninterrupted run (CPU)."""

import csv
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO


def _train(recipe, out, wait_for_kill=False):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "xmr", "train", "--config", str(recipe), "--out-dir", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait_for_kill:
        deadline = time.time() + 600
        while not (out / "last.pt").exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return proc.returncode
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output
    return output


def _history(out):
    with open(out / "history.csv") as f:
        return [{k: v for k, v in row.items() if k not in ("seconds", "samples_per_s")} for row in csv.DictReader(f)]


# CODER carries state outside the weights: momentum key encoders, a queue (64 entries: full and wrapped after one
# epoch of 15 steps x 16 keys) and its pointer, the concept vocabulary and graph. Losing any of them on resume
# changes the epoch-2 memory loss.
CASES = {"vsepp": {}, "coder": {"model": {"queue_size": 64, "n_prototypes": 16}}}


@pytest.mark.parametrize("method", list(CASES))
def test_killed_run_resumes_to_the_same_result(tiny_synth, tmp_path, method):
    recipe = tiny_synth.recipe(method, name=f"{method}_resume", train={"epochs": 3, "batch_size": 16},
                               **CASES[method])
    ref, killed = tmp_path / "uninterrupted", tmp_path / "killed"
    _train(recipe, ref)
    assert _train(recipe, killed, wait_for_kill=True) == -signal.SIGKILL
    assert not (killed / "train.json").exists()  # it really died before finishing
    output = _train(recipe, killed)
    assert f"resuming {killed} after epoch 1" in output  # continued, not restarted
    assert _history(killed) == _history(ref)  # same losses and validation metrics, epoch by epoch
