"""PCME: match probability, soft contrastive loss and KL against hand/naive computations; training end to end."""

import math

import numpy as np
import pytest
import torch

from xmr.config import load_run_config
from xmr.errors import XmrError
from xmr.losses.probabilistic import (gaussian_kl_to_standard, match_probability, released_vib_kl,
                                      sample_gaussian, soft_contrastive_loss, uniformity_loss)
from xmr.train.trainer import score_split, train


def logistic(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def naive_match_prob(x: np.ndarray, y: np.ndarray, a: float, b: float, k: float) -> float:
    """Mean over sample pairs of logistic(k·(-a‖x - y‖ + b)); x (J, D), y (L, D)."""
    return float(np.mean([logistic(k * (-a * np.linalg.norm(u - v) + b)) for u in x for v in y]))


def test_match_probability_by_hand():
    # image samples (0, 0) and (3, 4); one caption sample at the origin: distances 0 and 5
    img = torch.tensor([[[0.0, 0.0], [3.0, 4.0]]])
    cap = torch.tensor([[[0.0, 0.0]]])
    # a = 1, b = 2, plain logistic: (σ(2) + σ(-3)) / 2 (the zero distance is sqrt(1e-6) = 1e-3 in the loss)
    expected = (1 / (1 + math.exp(-(2 - 1e-3))) + 1 / (1 + math.exp(3))) / 2
    got = match_probability(img, cap, scale=1.0, shift=2.0, logit_scale=1.0)
    assert got.shape == (1, 1)
    assert got.item() == pytest.approx(expected, abs=1e-6)
    # released σ(x) = eˣ/(eˣ + e⁻ˣ): at x = 2 - 1e-3 and x = -3
    rel = lambda x: math.exp(x) / (math.exp(x) + math.exp(-x))  # noqa: E731
    got = match_probability(img, cap, scale=1.0, shift=2.0, logit_scale=2.0)
    assert got.item() == pytest.approx((rel(2 - 1e-3) + rel(-3)) / 2, abs=1e-6)


def naive_soft_contrastive(img: np.ndarray, cap: np.ndarray, pos: np.ndarray, a: float, b: float, k: float):
    pos_sum = neg_sum = 0.0
    for i in range(len(img)):
        for j in range(len(cap)):
            p = naive_match_prob(img[i], cap[j], a, b, k)
            if pos[i, j]:
                pos_sum += -math.log(p)
            else:
                neg_sum += -math.log(1 - p)
    return pos_sum, neg_sum


@pytest.mark.parametrize("k", [1.0, 2.0])
def test_soft_contrastive_loss_matches_formula(k):
    g = torch.Generator().manual_seed(0)
    img = torch.randn(3, 4, 5, generator=g) * 0.5
    cap = torch.randn(4, 4, 5, generator=g) * 0.5
    pos = torch.tensor([[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 0]], dtype=torch.bool)  # image 0 has two captions
    a, b = 1.7, 2.3
    want_pos, want_neg = naive_soft_contrastive(img.double().numpy(), cap.double().numpy(), pos.numpy(), a, b, k)
    out = soft_contrastive_loss(img, cap, pos, torch.tensor(a), torch.tensor(b), logit_scale=k, reduction="sum")
    assert out["pos"].item() == pytest.approx(want_pos, rel=1e-4)
    assert out["neg"].item() == pytest.approx(want_neg, rel=1e-4)
    assert out["loss"].item() == pytest.approx(want_pos + want_neg, rel=1e-4)
    mean = soft_contrastive_loss(img, cap, pos, a, b, logit_scale=k, reduction="mean")
    assert mean["loss"].item() == pytest.approx((want_pos + want_neg) / 12, rel=1e-4)


def test_soft_contrastive_loss_stays_finite_when_probabilities_underflow():
    # far apart positives: p(match) underflows float32, the log-space NLL must not
    img = torch.zeros(1, 2, 3)
    cap = torch.full((1, 2, 3), 10.0)  # distance 10·sqrt(3) ≈ 17.3
    out = soft_contrastive_loss(img, cap, torch.ones(1, 1, dtype=torch.bool), 15.0, 15.0, logit_scale=2.0)
    d = math.sqrt(300 + 1e-6)
    # -log σ_released(x) = log(1 + e^{-2x}) ≈ -2x for x = -15d + 15 ≪ 0
    assert out["loss"].item() == pytest.approx(-2 * (-15 * d + 15), rel=1e-5)


def test_kl_closed_form():
    # one 1-D Gaussian N(0.5, 2²): KL to N(0, 1) = ½ (μ² + σ² - 1 - log σ²) = ½ (0.25 + 4 - 1 - 2 log 2)
    mu, log_sigma = torch.tensor([[0.5]]), torch.tensor([[math.log(2.0)]])
    assert gaussian_kl_to_standard(mu, log_sigma).item() == pytest.approx(0.5 * (3.25 - 2 * math.log(2)), rel=1e-6)
    # sums over items and dimensions; agrees with torch.distributions
    g = torch.Generator().manual_seed(1)
    mu, log_sigma = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g) * 0.3
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mu, log_sigma.exp()),
                                            torch.distributions.Normal(0.0, 1.0)).sum()
    assert gaussian_kl_to_standard(mu, log_sigma).item() == pytest.approx(ref.item(), rel=1e-5)
    # released reading: -½ Σ (1 + s - m² - eˢ), m = mean of the samples: samples 0 and 1 -> m = 0.5, s = log 2
    samples = torch.tensor([[[0.0], [1.0]]])
    want = -0.5 * (1 + math.log(2) - 0.25 - 2)
    assert released_vib_kl(samples, torch.tensor([[math.log(2.0)]])).item() == pytest.approx(want, rel=1e-6)


def test_sampling_and_uniformity():
    mu, log_sigma = torch.tensor([[1.0, -1.0]]), torch.tensor([[math.log(0.5), 0.0]])
    noise = torch.tensor([[2.0, 3.0], [-1.0, 0.0]])
    z = sample_gaussian(mu, log_sigma, 2, noise=noise)
    assert torch.allclose(z, torch.tensor([[[2.0, 2.0], [0.5, -1.0]]]))
    pts = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])  # squared distances 1, 4, 5
    want = math.log((math.exp(-2) + math.exp(-8) + math.exp(-10)) / 3)
    assert uniformity_loss(pts, t=2.0).item() == pytest.approx(want, rel=1e-6)


def _tiny_model(tiny_synth, **model):
    from xmr.methods import METHODS
    from xmr.text.vocab import SPECIALS

    cfg = load_run_config(tiny_synth.recipe("pcme", name="pcme_unit", model=model,
                                            eval={"similarity": "model"}))
    torch.manual_seed(0)
    return METHODS.get("pcme")(cfg, 8, list(SPECIALS) + ["red", "ball"])


def _tiny_batch(model):
    feats = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(3))
    text = model.text.collate(["red ball", "ball", "red red ball"], [["red", "ball"], ["ball"], ["red", "red", "ball"]])
    return feats, torch.tensor([4, 2, 3]), text


@pytest.mark.parametrize("form,k", [("released", 2.0), ("paper", 1.0)])
def test_eval_scores_are_match_probabilities_of_fixed_samples(tiny_synth, form, k):
    model = _tiny_model(tiny_synth, match_sigmoid=form, num_samples_eval=3, init_scale=2.0, init_shift=1.0)
    feats, nr, text = _tiny_batch(model)
    model.eval()
    with torch.no_grad():
        img, cap = model(feats, nr, text)
        assert img.shape == (3, 3, 32) and cap.shape == (3, 3, 32)
        # the noise is fixed per item: a sub-batch gets the same samples (up to matmul rounding)
        img_one = model.encode_image(feats[1:2], nr[1:2])
        assert torch.allclose(img_one[0], img[1], atol=1e-5)
        assert not torch.allclose(img[0, 0], img[0, 1])  # but the J samples of an item differ
        sims = model.similarity_matrix(img, cap).numpy()
    want = np.array([[naive_match_prob(img[i].double().numpy(), cap[j].double().numpy(), 2.0, 1.0, k)
                      for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(sims, want, atol=1e-5)


def test_training_outputs_gradients_and_score_options(tiny_synth):
    model = _tiny_model(tiny_synth, num_samples=2)
    feats, nr, text = _tiny_batch(model)
    model.train()
    img, cap = model(feats, nr, text)
    assert img.shape == (3, 2, 32)  # [μ, log σ]
    assert torch.allclose(img[:, 0].norm(dim=-1), torch.ones(3), atol=1e-5)
    out = model.compute_loss(img, cap, torch.eye(3, dtype=torch.bool), 0.0)
    out["loss"].backward()
    for p in (model.scale, model.shift, model.image_sigma.fc.weight, model.text_sigma.fc.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    # mean_cosine ranks by the cosine of the means: eval output is μ itself
    cos_model = _tiny_model(tiny_synth, pcme_score="mean_cosine")
    cos_model.load_state_dict(model.state_dict())
    cos_model.eval()
    with torch.no_grad():
        mu = cos_model.encode_image(feats, nr)
        model.train()
        assert torch.allclose(mu, model.encode_image(feats, nr)[:, 0], atol=1e-6)


def test_similarity_must_fit_score(tiny_synth):
    cfg = load_run_config(tiny_synth.recipe("pcme", name="pcme_bad", model={"pcme_score": "mean_cosine"},
                                            eval={"similarity": "match_prob"}))
    from xmr.methods import METHODS
    from xmr.text.vocab import SPECIALS

    with pytest.raises(XmrError, match="eval.similarity: cosine"):
        METHODS.get("pcme")(cfg, 8, list(SPECIALS))


def test_pcme_trains_scores_and_is_deterministic(tiny_synth, tmp_path):
    cfg = load_run_config(tiny_synth.recipe("pcme", train={"epochs": 2}, model={"attention_hidden": 16}))
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["best_epoch"] in (1, 2) and np.isfinite(summary["history"][-1]["loss"])
    sims, info = score_split(tmp_path / "run", progress=False)
    assert sims.shape == (12, 60) and info["split"] == "test"
    assert np.isfinite(sims).all() and sims.min() >= 0.0 and sims.max() <= 1.0  # probabilities
    again, _ = score_split(tmp_path / "run", progress=False)
    np.testing.assert_array_equal(sims, again)
