"""Every script in benchmarks/ answers `--help` with its usage and exit 0, and measures nothing: a user (and the
docs test's dry runs, which append --help) can ask any of them what it does without starting a benchmark. And the
one that re-runs the workflow's jobs by itself (device_session.py) runs the jobs the workflow plans."""

from __future__ import annotations

import json
import shlex
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


def test_the_device_sessions_demo_lane_runs_the_jobs_snakemake_plans_for_make_demo():
    """benchmarks/device_session.py times `make demo` on machines without snakemake and MLflow by running its jobs
    itself: they must stay the jobs the workflow runs, flag for flag (tracking switched off aside)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import device_session
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-n", "-p", "-F", "--nolock", "-c2",
           "results/synth/dvse_demo.json", "results/synth/dvse_demo_fr.json"]
    r = subprocess.run(cmd, cwd=REPO, env=xmr_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    planned = []
    for line in r.stdout.splitlines():
        if line.startswith("Shell command:"):
            words = shlex.split(line.split(":", 1)[1])
            end = next((i for i, w in enumerate(words) if w in (">", "2>&1", "|")), len(words))
            assert words[1:3] == ["-m", "xmr"], line
            planned.append(words[3:end])
    lane = [[w for w in job[3:] if w not in ("--no-tracking", "--set", "tracking.enabled=false")]
            for stage in device_session.demo_jobs() for job in stage]
    assert len(planned) == 8  # synth, 3 extractions, train, score, 2 evaluations
    assert sorted(lane) == sorted(planned)


def test_bench_eval_cli_times_pairs_alone_and_profiles_the_command(tmp_path):
    """`--only-pairs --profile --floor` (the short form a time-boxed run on another machine uses): the interleaved pairs, the
    NumPy-only floor beside each, and a profile of the documented `xmr evaluate` command, none of the separate
    measurements."""
    out = tmp_path / "cli.json"
    r = subprocess.run([sys.executable, "benchmarks/bench_eval_cli.py", "--scale", "0.01", "--only-pairs",
                        "--pairs", "2", "--profile", "--floor", "--json", str(out)], cwd=REPO, env=xmr_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    pairs = res["interleaved"]["pairs"]
    assert len(pairs) == 2
    for p in pairs:
        assert p["ratio_wall"] == pytest.approx(p["cli_wall_s"] / p["gemm_wall_s"])
    median = (pairs[0]["ratio_wall"] + pairs[1]["ratio_wall"]) / 2  # of two
    assert res["interleaved"]["median_ratio_wall"] == pytest.approx(median)
    gemm_median = (pairs[0]["gemm_wall_s"] + pairs[1]["gemm_wall_s"]) / 2
    assert res["interleaved"]["allowance_s"] == pytest.approx(0.4 * gemm_median)
    # torch's import takes a measurable time (seconds, not a parse of something else); its median is of the pairs
    assert all(0.05 < p["import_torch_wall_s"] < 120 for p in pairs)
    torch_median = (pairs[0]["import_torch_wall_s"] + pairs[1]["import_torch_wall_s"]) / 2
    assert res["interleaved"]["median_import_torch_s"] == pytest.approx(torch_median)
    assert "torch's import alone" in r.stdout
    # the floor computes the command's formula apart, in NumPy: the same RSUM as the CLI's metrics file
    for p in pairs:
        assert p["floor_rsum"] == pytest.approx(p["cli_rsum"], abs=1e-9)
        assert p["floor_ratio_wall"] == pytest.approx(p["floor_wall_s"] / p["gemm_wall_s"])
    floor_median = (pairs[0]["floor_ratio_wall"] + pairs[1]["floor_ratio_wall"]) / 2
    assert res["interleaved"]["median_floor_ratio_wall"] == pytest.approx(floor_median)
    assert "ncalls" in res["profile_top"][0] and len(res["profile_top"]) == 26
    assert "bare_numpy" not in res and "cli_native" not in res and "torch_gemm_native" not in res
    assert "cProfile of the default CLI" in r.stdout


def test_bench_test_cpu_logs_each_process_and_groups_the_log_by_kind(tmp_path):
    # the sitecustomize it puts into a venv: one line per Python process at exit (CPU s, wall s, argv)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_test_cpu
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    site, log = tmp_path / "site", tmp_path / "cpu.tsv"
    site.mkdir()
    (site / "sitecustomize.py").write_text(bench_test_cpu.sitecustomize(log))
    script = tmp_path / "benchmarks" / "spin.py"
    script.parent.mkdir()
    script.write_text("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n")
    env = {**xmr_env(), "PYTHONPATH": str(site)}
    subprocess.run([sys.executable, str(script), "--flag"], env=env, check=True, timeout=60)
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)
    subprocess.run([sys.executable, "-c", "import xdist"], env=env, check=True, timeout=60)  # as a worker is
    (spin, plain, worker) = bench_test_cpu.read_log(log.read_text())
    assert (spin["argv"], plain["argv"], worker["argv"]) == ([str(script), "--flag"], ["-c"], ["<pytest-xdist worker>"])
    assert spin["cpu_s"] >= 0.3 and spin["wall_s"] >= spin["cpu_s"] - 0.05
    assert [bench_test_cpu.kind(r["argv"]) for r in (spin, plain, worker)] == [
        "benchmarks/ scripts", "python -c", "pytest-xdist worker"]

    # a log read by the command a user types: worked by hand, 8.25 CPU s in four whole lines
    log.write_text('1.50\t2.0\t["/v/lib/python3.11/site-packages/xmr/__main__.py", "train", "--config", "a.yaml"]\n'
                   '2.50\t3.0\t["/v/bin/xmr", "train"]\n'
                   '0.25\t1.0\t["/v/lib/python3.11/site-packages/snakemake/__main__.py", "-n"]\n'
                   '4.00\t60.0\t["<pytest-xdist worker>"]\n'
                   '3.00\t4.0\t["/v/bin/dv\n')  # cut short: skipped
    out = tmp_path / "groups.json"
    r = subprocess.run([sys.executable, "benchmarks/bench_test_cpu.py", "--log", str(log), "--json", str(out)],
                       cwd=REPO, env=xmr_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["groups"] == [
        {"kind": "pytest-xdist worker", "processes": 1, "cpu_s": 4.0, "cpu_s_each": 4.0, "share": 0.485},
        {"kind": "xmr train", "processes": 2, "cpu_s": 4.0, "cpu_s_each": 2.0, "share": 0.485},
        {"kind": "snakemake", "processes": 1, "cpu_s": 0.25, "cpu_s_each": 0.25, "share": 0.03}]
    assert "| 2 | xmr train | 4.0 | 2.00 | 48.5 % |" in r.stdout and "| 4 | all | 8.2 | | |" in r.stdout
