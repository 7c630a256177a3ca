"""benchmarks/bench_demo.py's reading of a demo's logs and of the README's table (the script itself clones the
repository and runs `make demo`: minutes and ~7 GB, so it is run by hand and its figures recorded)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_demo", REPO / "benchmarks" / "bench_demo.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# the shape of a Snakemake 9 log (`make demo`), times shortened to what the test needs
LOG = """Building DAG of jobs...
[Fri Nov 27 02:20:41 2026]
localrule synth:
    output: data/synth/dataset_synth.json
    jobid: 4
    reason: Missing output files: data/synth/dataset_synth.json
[Fri Nov 27 02:20:44 2026]
Finished jobid: 4 (Rule: synth)
1 of 8 steps (12%) done
[Fri Nov 27 02:20:44 2026]
localrule extract:
    jobid: 5
[Fri Nov 27 02:20:44 2026]
localrule extract:
    jobid: 3
[Fri Nov 27 02:20:49 2026]
Finished jobid: 5 (Rule: extract)
[Fri Nov 27 02:20:49 2026]
localrule extract:
    jobid: 6
[Fri Nov 27 02:21:02 2026]
Finished jobid: 6 (Rule: extract)
[Fri Nov  7 02:21:03 2026]
Finished jobid: 3 (Rule: extract)
"""


def test_job_spans_and_phases_from_a_snakemake_log():
    log = LOG.replace("Nov  7", "Nov 27")  # one-digit days are space-padded by Snakemake: both forms parse
    spans = bench.job_spans(log)
    assert [(j["rule"], j["jobid"]) for j in spans] == [("synth", 4), ("extract", 3), ("extract", 5), ("extract", 6)]
    # synth 02:20:41 -> :44; extract from its first start (02:20:44) to its last end (02:21:03)
    assert bench.phases(spans) == {"synth": 3.0, "extract": 19.0}
    assert bench.job_spans(LOG)[1]["end"].day == 7


def test_readme_table_rsums_and_epoch_seconds():
    readme = ("| dataset | target | protocol | i2t R@1 | RSUM | epochs |\n|---|---|---|---|---|---|\n"
              "| synth | dvse | plain | 24.4 | 232.1 | 4 |\n| synth | dvse_fr | plain | 25.5 | 256.1 | 4 |\n"
              "| synth | dvse | cub | 1.0 | 9.9 | 4 |\n")
    assert bench.readme_rsums(readme) == {"dvse": 232.1, "dvse_fr": 256.1}
    assert set(bench.readme_rsums((REPO / "README.md").read_text())) == {"dvse_demo", "dvse_demo_fr"}
    log = "epoch 1/4 loss=54.1 val_rsum=122.4 samples_per_s=531.2 seconds=18.8\nbest validation RSUM\n" \
          "epoch 2/4 loss=50.2 val_rsum=177.0 samples_per_s=574.2 seconds=17.4\n"
    assert bench.epoch_seconds(log) == [18.8, 17.4]


def test_the_benchmark_checks_the_readme_tolerance():
    """bench_demo.py and `make demo` (`xmr show --expect`) hold the demo's RSUMs to one tolerance."""
    import argparse

    from xmr.commands import show

    parser = argparse.ArgumentParser()
    show.add_arguments(parser)
    assert bench.RSUM_TOLERANCE == parser.get_default("rsum_tolerance") == 8.0


def test_exit_status_follows_both_targets(monkeypatch, capsys):
    table = bench.readme_rsums((REPO / "README.md").read_text())
    for pipeline, dvse_gap, status in ((57, 0.0, 0), (64, 0.0, 1), (50, -8.5, 1), (60, 7.9, 0)):
        rsum = {"dvse_demo": table["dvse_demo"] + dvse_gap, "dvse_demo_fr": table["dvse_demo_fr"]}
        monkeypatch.setattr(bench, "run_once", lambda keep, p=pipeline, r=rsum: {
            "venv_s": 1.0, "pipeline_s": p, "phases_s": {"train": 1.0}, "epochs_s": [1.0], "rsum": r, "clone": None})
        assert bench.main([]) == status, (pipeline, dvse_gap)
        assert capsys.readouterr().out.splitlines()[-1] == ("targets met" if status == 0 else "targets NOT met")
