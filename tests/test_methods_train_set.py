"""pvse, dive and dvse train a few steps on the tiny synthetic set; score_split gives their set similarity."""

import math

import numpy as np
import pytest
import torch

from xmr.run.config import load_run_config
from xmr.inference.loaders import load_split_with_features
from xmr.train.trainer import train
from xmr.inference.model import encode_split_of, load_trained, score_split
from xmr.settings.run_settings import run_settings


def naive_set_score(x: torch.Tensor, y: torch.Tensor, measure: str, alpha: float = 16.0) -> float:
    """Score of one image set x (K, D) or vector, one caption set y (L, D) or vector, by loops."""
    x, y = (x[None] if x.ndim == 1 else x).double(), (y[None] if y.ndim == 1 else y).double()
    c = [[float(a @ b / (a.norm() * b.norm())) for b in y] for a in x]
    if measure == "max":
        return max(max(r) for r in c)
    assert measure == "smooth_chamfer"
    k, n = len(c), len(c[0])
    s1 = sum(math.log(sum(math.exp(alpha * v) for v in row)) for row in c) / (2 * alpha * k)
    s2 = sum(math.log(sum(math.exp(alpha * c[i][j]) for i in range(k))) for j in range(n)) / (2 * alpha * n)
    return s1 + s2


CASES = {
    "pvse": ({"model": {"num_embeds": 2}}, (2, 2)),
    "dive": ({"model": {"num_embeds": 3, "iterations": 2, "heads": 2, "dim_head": 8, "image_global_pool": "mean",
                        "image_pos_enc": "sine2d"}}, (3, 3)),
    # drop_terms: masked sub-embeddings leave L_var and the test max (the trained default, gate, is in test_dvse)
    "dvse": ({"model": {"num_embeds": 3, "dynamic_mask": {"mode": "drop_terms"}}}, (3, None)),
}


@pytest.mark.parametrize("method", list(CASES))
def test_set_method_trains_and_scores(tiny_synth, tmp_path, method):
    sections, (k_img, k_txt) = CASES[method]
    # random word vectors: loading GloVe three times would dominate the test's run time
    cfg = load_run_config(tiny_synth.recipe(method, name=f"{method}_smoke",
                                            text={"word_vectors": None, "word_dim": 16}, **sections))
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["best_epoch"] == 1
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in summary["history"])
    sims, info = score_split(tmp_path / "run", progress=False)
    assert sims.shape == (12, 60) and info["split"] == "test" and np.isfinite(sims).all()

    # the saved scores are the method's set similarity of its embeddings
    model, rcfg = load_trained(tmp_path / "run")
    data, feats = load_split_with_features(run_settings(rcfg).image, rcfg["dataset_cfg"], "test")
    img, cap = encode_split_of(model, run_settings(rcfg), data, feats, torch.device("cpu"), max_images=2)
    assert img.shape[1:] == (k_img, 32) and (cap.shape[1:] == (k_txt, 32) if k_txt else cap.shape[1:] == (32,))
    for i in range(2):
        for j in range(0, 10, 3):
            want = naive_set_score(img[i], cap[j], rcfg["eval"]["similarity"], rcfg["eval"]["alpha"])
            assert sims[i, j] == pytest.approx(want, abs=1e-5)
