"""Every script in benchmarks/ answers `--help` with its usage and exit 0, and measures nothing: a user (and the
docs test's dry runs, which append --help) can ask any of them what it does without starting a benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import xmr_env

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))


def test_the_list_of_scripts_is_the_folder():  # an empty glob would parametrize nothing and pass
    assert "check_cpu_isa.py" in SCRIPTS and "bench_demo.py" in SCRIPTS and len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_usage_and_runs_nothing(script):
    r = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=REPO, env=xmr_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    # argparse's help is all it printed: a measurement would print its table, digests or figures first
    assert r.stdout.startswith(f"usage: {script}"), r.stdout[:500]
    assert "options:" in r.stdout
