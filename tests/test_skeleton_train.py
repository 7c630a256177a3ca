"""The walking skeleton end to end at toy size: VSE++ trains, scores and evaluates."""

import numpy as np

from xmr.config import load_run_config
from xmr.train.trainer import score_split, train


def test_vsepp_trains_and_scores(tiny_synth, tmp_path):
    cfg = load_run_config(tiny_synth.recipe("vsepp", train={"epochs": 2}))
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["best_epoch"] in (1, 2)
    for name in ("best.pt", "last.pt", "config.yaml", "history.csv", "train.json"):
        assert (tmp_path / "run" / name).exists(), name
    sims, info = score_split(tmp_path / "run", progress=False)
    assert sims.shape == (12, 60) and info["split"] == "test"
    assert np.isfinite(sims).all() and np.abs(sims).max() <= 1.0 + 1e-5  # cosine of unit vectors
