"""Paper-reading and alternative options of the single-embedding methods (VSE∞, VSE+2AD, CODER) train, reload
and score end to end on the tiny synthetic set (each method's default configuration: test_method_conformance.py)."""

import numpy as np
import pytest

from xmr.run.config import load_run_config
from xmr.train.trainer import train
from xmr.inference.model import load_trained, score_split

CASES = {
    "vse_inf_grid_mlp2": {"model": {"residual_mlp": False, "size_augment": {"mode": "grid"},
                                    "gpo": {"mlp_layers": 2}}},
    "vse_2ad_paper": {"model": {"adpool": {"token_weight": "scalar", "mask_pad_in_token_softmax": True}},
                      "loss": {"k_rule": "paper", "diag_mask": "zero", "direction_reduce": "sum",
                               "positive_in_denominator": False, "margin": 0.0}},
    "vse_2ad_triplet_manual": {"model": {"image_pool": "kmax", "text_pool": "mean"}, "loss": {"name": "triplet"}},
    "coder": {"model": {"queue_size": 64, "n_prototypes": 16}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_method_trains_reloads_and_scores(tiny_synth, tmp_path, case):
    method = case.split("_grid")[0].split("_paper")[0].split("_triplet")[0]
    cfg = load_run_config(tiny_synth.recipe(method, name=case, train={"epochs": 1}, **CASES[case]))
    summary = train(cfg, tmp_path / "run", progress=False)
    losses = [row["loss"] for row in summary["history"]]
    assert len(losses) == 1 and np.isfinite(losses[0]) and summary["best_epoch"] == 1
    sims, info = score_split(tmp_path / "run", progress=False)
    assert sims.shape == (12, 60) and info["split"] == "test"
    assert np.isfinite(sims).all() and np.abs(sims).max() <= 1.0 + 1e-5
    if method == "coder":
        model, _ = load_trained(tmp_path / "run")
        assert model.concept_words and bool(model.concepts_built)
        assert int(model.concept_valid.sum()) == len(model.concept_words)
        assert "triangle" in model.concept_words and "the" not in model.concept_words


def test_vse_inf_loss_decreases_over_epochs(tiny_synth, tmp_path):
    cfg = load_run_config(tiny_synth.recipe("vse_inf", name="vse_inf_long", train={"epochs": 3},
                                            loss={"warmup_epochs": 0}))
    losses = [row["loss"] for row in train(cfg, tmp_path / "run", progress=False)["history"]]
    assert losses[-1] < losses[0]
