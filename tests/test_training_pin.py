"""A portable pin of training: a short vsepp training on the tiny synth set reproduces, epoch by epoch, the losses
and validation similarity statistics that the previous release (d97c733) wrote for the same recipe
(tests/fixtures/old_run/vsepp/history.csv; tests/fixtures/old_run/make_old_run.py). The tolerance, relative 1e-3
(absolute 1e-4 near zero), holds across CPUs: xmr pins torch's CPU kernels to AVX2, so Intel and AMD machines differ
only in the last bits of float32 sums, far below it, while any change of what training computes (sampling order,
seeding, loss, schedule) moves these numbers by percents. On the machine that wrote the fixture the run is
bit-identical (the side-by-side check of the trainer redesign)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from xmr.run_config import load_run_config
from xmr.train.trainer import train

HISTORY = Path(__file__).resolve().parent / "fixtures" / "old_run" / "vsepp" / "history.csv"
CONTINUOUS = ("loss", "val_sim_mean", "val_sim_std", "val_margin")


def test_short_training_matches_the_previous_release(tiny_synth, tmp_path):
    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_pin", train={"epochs": 3, "seed": 7}))
    summary = train(cfg, tmp_path / "run", progress=False)
    with open(HISTORY) as f:
        written = list(csv.DictReader(f))
    assert [r["epoch"] for r in summary["history"]] == [int(r["epoch"]) for r in written] == [1, 2, 3]
    for now, then in zip(summary["history"], written):
        for key in CONTINUOUS:
            assert now[key] == pytest.approx(float(then[key]), rel=1e-3, abs=1e-4), (now["epoch"], key)
        assert now["lr"] == float(then["lr"])
