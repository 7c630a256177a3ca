"""The suite's forked commands (tests/forked_xmr.py) behave as `python -m xmr` does: the same output and exit
status, their own process, and no environment that would need a fresh interpreter."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_xmr_forked, start_xmr_forked, xmr_env


def test_a_forked_command_prints_and_exits_as_the_interpreter_does(tmp_path):
    args = ("evaluate", "--sims", tmp_path / "missing.npy", "--captions-per-image", "5", "--out", tmp_path / "m.json")
    fresh = subprocess.run([sys.executable, "-m", "xmr", *map(str, args)], cwd=REPO, env=xmr_env(),
                           capture_output=True, text=True, timeout=300)
    forked = run_xmr_forked(*args, cwd=REPO)
    assert fresh.returncode != 0  # a real error, with its one line
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_forked_command_is_its_own_process_and_dies_alone(tmp_path):
    # `xmr synth` of many images in one process: killed once it has started writing (its temporary folder)
    work = tmp_path / "work"
    work.mkdir()
    proc = start_xmr_forked("synth", "--out", work / "synth", "--set", "n_train=100000")
    assert proc.pid != os.getpid()
    deadline = time.time() + 120
    while not any(work.iterdir()):
        assert proc.poll() is None and time.time() < deadline, proc.wait(0)
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(60).returncode == -signal.SIGKILL
    assert not (work / "synth").exists()  # stopped mid-way: the folder appears complete or not at all


def test_an_environment_read_at_import_is_refused():
    with pytest.raises(AssertionError, match="ATEN_CPU_CAPABILITY"):
        start_xmr_forked("--version", env=xmr_env(ATEN_CPU_CAPABILITY="avx2"))
