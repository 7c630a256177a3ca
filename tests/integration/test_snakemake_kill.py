"""Snakemake itself killed with a job running (docs/faults.md): a plain rerun refuses the partial output, and
after `snakemake --unlock` a rerun with --rerun-incomplete redoes the incomplete job and nothing else; when a
job fails the workflow tells the user about `--unlock`."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest

from .helpers import BIN, REPO

pytestmark = pytest.mark.integration

# the project's common rules (configfile, schema, onerror handler) plus two tiny shell jobs: `a`, then `b`,
# which writes a partial output and waits for a `go` file (so the kill lands while it runs)
SNAKEFILE = f'''include: "{REPO}/workflow/rules/common.smk"

rule all:
    input: "b.txt"

rule a:
    output: "a.txt"
    shell: "echo a > {{output}}; echo ran >> runs_a.log"

rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "echo partial > {{output}}; echo ran >> runs_b.log; until [ -e go ]; do sleep 0.1; done; echo b > {{output}}"

rule fail:
    output: "never.txt"
    shell: "exit 3"
'''


def _smk(cwd: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(BIN / "snakemake"), "--cores", "1", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, **kw)


@pytest.fixture
def workdir(tmp_path) -> Path:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    return tmp_path


def test_kill_snakemake_then_unlock_reruns_only_the_incomplete_job(workdir):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([str(BIN / "snakemake"), "--cores", "1"], cwd=workdir, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    # job b runs, and Snakemake has recorded it as started: it writes that record (.snakemake/incomplete/, one file
    # named by the output's base64) just after spawning the job, so on a loaded machine the job's first line can
    # come first, and a kill in between leaves a partial b.txt Snakemake never saw start (xmr's own jobs write
    # their outputs by rename, so no partial output of theirs can exist at all)
    started = workdir / ".snakemake" / "incomplete" / urlsafe_b64encode(b"b.txt").decode()
    while not ((workdir / "runs_b.log").exists() and started.exists()):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # Snakemake and its job, as a pre-emption does
    proc.wait()
    assert (workdir / "b.txt").read_text() == "partial\n"
    (workdir / "go").touch()

    refused = _smk(workdir)  # the partial b.txt is never trusted
    assert refused.returncode != 0 and "--rerun-incomplete" in refused.stderr
    assert "b.txt" in refused.stderr.split("Incomplete files:")[-1]
    assert _smk(workdir, "--unlock").returncode == 0  # what docs/faults.md says to do first (a left lock)
    rerun = _smk(workdir, "--rerun-incomplete")
    assert rerun.returncode == 0, rerun.stderr
    assert (workdir / "b.txt").read_text() == "b\n"
    assert (workdir / "runs_a.log").read_text() == "ran\n"  # the finished job was not redone
    assert (workdir / "runs_b.log").read_text() == "ran\nran\n"  # the killed one was, once
    assert "Nothing to be done" in _smk(workdir).stderr


def test_failed_job_message_names_unlock(workdir):
    r = _smk(workdir, "never.txt")
    assert r.returncode != 0
    assert "run `snakemake --unlock` once, then the same command with --rerun-incomplete" in r.stderr


def test_unknown_workflow_config_key_is_one_line(workdir):
    """Snakemake's own validate() printed the whole schema (113 lines) for a misspelt key."""
    r = _smk(workdir, "-n", "--config", "summary_target=1")
    assert r.returncode == 1
    assert r.stderr.strip() == ("xmr workflow: error: config/config.yaml (with --config overrides): unknown key "
                                "'summary_target'; did you mean: summary_targets?")
