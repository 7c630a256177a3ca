"""Workflow commands a user met problems with, run as a user types them: a typo'd Snakemake target, the size line of the seeded
benchmark's dry run, `make sync` after a partial reproduction."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, xmr_env


def _env() -> dict[str, str]:
    env = xmr_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_typo_in_a_snakemake_target_is_one_line():
    r = subprocess.run(["snakemake", "-n", "--nolock", "results/synth/vsep.json"], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, r.stdout + r.stderr
    assert lines[0].startswith("snakemake: no recipe for results/synth/vsep.json: expected "
                               "config/recipes/synth/vsep.yaml (recipes for synth: "), lines[0]


def test_benchmark_dry_run_says_how_many_trainings_it_implies():
    from xmr.studies.benchmark import load_benchmark
    from xmr.studies.claims import joint_family_benchmarks

    bench = load_benchmark(REPO / "config" / "benchmark" / "benchmark.yaml", REPO / "config")
    # one training per variant x seed, of this file and of the files sharing its Holm families (runs_from: once)
    benches = [bench] + joint_family_benchmarks(bench)
    n = len({b.run_dir(v, s) for b in benches for v in b.variants for s in b.seeds})
    r = subprocess.run(["snakemake", "-n", "--nolock", "results/synth/benchmark.md"], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(rf"^results/synth/benchmark\.md implies {n} trainings \(\d+ already trained, \d+ to run;",
                     r.stderr, re.M), r.stderr[-2000:]


def test_make_sync_after_a_partial_reproduction(tmp_path):
    # two DVC stages wrapping Snakemake targets, only one reproduced (the state `make demo` + one `dvc repro`
    # leaves): `make sync` must check out what exists and touch its targets, not stop on the other stage
    env = _env()
    (tmp_path / "Snakefile").write_text(
        'rule a:\n    output: "out/a.txt"\n    shell: "mkdir -p out && echo a > {output}"\n'
        'rule b:\n    output: "out/b.txt"\n    shell: "mkdir -p out && echo b > {output}"\n')
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n" + "".join(f"  {s}:\n    cmd: snakemake --cores 1 out/{s}.txt\n    outs:\n"
                              f"      - out/{s}.txt:\n          persist: true\n" for s in "ab"))
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q", "a"]):
        subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300)
    r = subprocess.run(["make", "-f", str(REPO / "Makefile"), "sync"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "snakemake --touch --cores 1 out/a.txt" in r.stdout
    assert not (tmp_path / "out" / "b.txt").exists()
