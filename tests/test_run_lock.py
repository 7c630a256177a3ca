"""One writer per run directory (xmr/run/lock.py): a second `xmr train` on a live run exits in one line naming the
holder; a lock file left by a killed writer is taken over with a log line; DDP takes one lock per training."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from xmr.core.errors import XmrError
from xmr.run.lock import HELD_ENV, LOCK_NAME, RunLock, launcher_run_lock, process_run_lock, read_holder

from conftest import run_xmr_forked, xmr_env

HOLD = ("import sys, time; from xmr.run.lock import RunLock; RunLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(600)")


@pytest.fixture
def holder(tmp_path):
    """A live process holding the lock of ``tmp_path / 'run'``."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], env=xmr_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield run, proc
    proc.kill()
    proc.wait()


def test_second_train_on_a_live_run_exits_in_one_line_naming_the_holder(holder, tiny_synth):
    run, proc = holder
    recipe = tiny_synth.recipe("vsepp", name="vsepp_locked")
    out = run_xmr_forked("train", "--config", recipe, "--out-dir", run, "--no-progress", timeout=300)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"xmr train: error: {run} is being written by another training: ")
    assert f"host {socket.gethostname()}, pid {proc.pid} " in lines[0]
    # nothing of the run was touched: the holder's lock file only
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]
    assert read_holder(run)["pid"] == proc.pid


def test_lock_of_a_killed_writer_is_taken_over_with_a_log_line(holder, capsys):
    run, proc = holder
    proc.send_signal(signal.SIGKILL)  # as kill -9 / the OOM killer: nothing of the holder's own code runs
    proc.wait()
    assert read_holder(run)["pid"] == proc.pid  # its lock file stays behind
    with RunLock(run):
        said = capsys.readouterr().out
        assert f"taking over the lock of a writer that is gone (host {socket.gethostname()}, pid {proc.pid} " in said
        assert read_holder(run)["pid"] == os.getpid()
        with pytest.raises(XmrError, match=f"pid {os.getpid()} "):  # and it is held again: by us
            RunLock(run).acquire()
    assert not (run / LOCK_NAME).exists()  # a finished writer leaves no lock file
    with RunLock(run):  # free again, and nothing to take over
        assert "taking over" not in capsys.readouterr().out


def test_one_lock_per_training_under_a_launcher(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.delenv(HELD_ENV, raising=False)
    assert isinstance(process_run_lock(run, rank=0), RunLock)
    assert not isinstance(process_run_lock(run, rank=1), RunLock)  # only rank 0 locks
    with launcher_run_lock(run):  # `xmr train --nproc-per-node N` holds it for its children
        assert os.environ[HELD_ENV] == str(run.resolve())
        assert not isinstance(process_run_lock(run, rank=0), RunLock)
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert HELD_ENV not in os.environ and not (run / LOCK_NAME).exists()


def test_a_training_that_fails_before_writing_leaves_no_directory(tmp_path):
    run = tmp_path / "runs" / "synth" / "x"
    with RunLock(run):
        assert (run / LOCK_NAME).is_file()
    assert not (tmp_path / "runs").exists()  # the lock made runs/synth/x and removes what it made
    (tmp_path / "keep").mkdir()
    with RunLock(tmp_path / "keep"):
        (tmp_path / "keep" / "last.pt").write_bytes(b"")
    assert sorted(p.name for p in (tmp_path / "keep").iterdir()) == ["last.pt"]
