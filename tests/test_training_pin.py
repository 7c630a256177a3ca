"""A portable pin of training: a short vsepp training on the tiny synth set reproduces, epoch by epoch, the losses
and validation similarity statistics that the previous release (d97c733) wrote for the same recipe
(tests/fixtures/old_run/vsepp/history.csv; tests/fixtures/old_run/make_old_run.py). The tolerance, relative 1e-3
(absolute 1e-4 near zero), holds across CPUs: other kernels (an AVX-512 CPU's native ones, or another vendor's)
change only the last bits of float32 sums, far below it, while any change of what training computes (sampling
order, seeding, loss, schedule) moves these numbers by percents. The fixture was written under the previous
release's AVX2 pins; this test passes both with the native kernels of the AVX-512 AMD EPYC development machine (the
default) and with ``XMR_PORTABLE_CPU=1``, so two kernel sets of one CPU stand in for two CPUs here."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from xmr.run.config import load_run_config
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
