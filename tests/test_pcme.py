"""PCME: match probability, soft contrastive loss and KL against hand/naive computations; training end to end."""

import math

import numpy as np
import pytest
import torch

from xmr.run.config import load_run_config
from xmr.core.errors import XmrError
from xmr.losses.probabilistic import (gaussian_kl_to_standard, match_probability, released_vib_kl,
                                      sample_gaussian, soft_contrastive_loss, uniformity_loss)
from xmr.train.trainer import train
from xmr.inference.model import score_split


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

    # dsl/mr must read the scores as what pcme_score makes them (log-probabilities only for log_match_prob)
    scores = "log_prob" if model.get("pcme_score", "log_match_prob") == "log_match_prob" else "similarity"
    cfg = load_run_config(tiny_synth.recipe("pcme", name="pcme_unit", model=model,
                                            eval={"similarity": "model", "rerank": {"dsl": {"scores": scores},
                                                                                    "mr": {"scores": scores}}}))
    torch.manual_seed(0)
    return METHODS.get("pcme").from_config(cfg, 8, list(SPECIALS) + ["red", "ball"])


def _tiny_batch(model):
    feats = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(3))
    text = model.text.collate(["red ball", "ball", "red red ball"], [["red", "ball"], ["ball"], ["red", "red", "ball"]])
    return feats, torch.tensor([4, 2, 3]), text


@pytest.mark.parametrize("score", ["log_match_prob", "match_prob"])
@pytest.mark.parametrize("form,k", [("released", 2.0), ("paper", 1.0)])
def test_eval_scores_are_match_probabilities_of_fixed_samples(tiny_synth, form, k, score):
    model = _tiny_model(tiny_synth, match_sigmoid=form, num_samples_eval=3, init_scale=2.0, init_shift=1.0,
                        pcme_score=score)
    assert model.eval_similarity == score
    feats, nr, text = _tiny_batch(model)
    model.eval()
    with torch.no_grad():
        fwd = model(feats, nr, text)
        img, cap = fwd["img"], fwd["txt"]
        assert img.shape == (3, 3, 32) and cap.shape == (3, 3, 32)
        # the noise is fixed per item: a sub-batch gets the same samples (up to matmul rounding)
        img_one = model.encode_image(feats[1:2], nr[1:2])
        assert torch.allclose(img_one[0], img[1], atol=1e-5)
        assert not torch.allclose(img[0, 0], img[0, 1])  # but the J samples of an item differ
        sims = model.similarity_matrix(img, cap).numpy()
    want = np.array([[naive_match_prob(img[i].double().numpy(), cap[j].double().numpy(), 2.0, 1.0, k)
                      for j in range(3)] for i in range(3)])
    if score == "log_match_prob":  # the default: the log of the same probabilities
        want = np.log(want)
    np.testing.assert_allclose(sims, want, atol=1e-5, rtol=1e-5)


def test_training_outputs_gradients_and_score_options(tiny_synth):
    model = _tiny_model(tiny_synth, num_samples=2)
    feats, nr, text = _tiny_batch(model)
    model.train()
    fwd = model(feats, nr, text)
    img = fwd["img"]
    assert img.shape == (3, 2, 32)  # [μ, log σ]
    assert torch.allclose(img[:, 0].norm(dim=-1), torch.ones(3), atol=1e-5)
    out = model.compute_loss(fwd, torch.eye(3, dtype=torch.bool), 0.0)
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
        METHODS.get("pcme").from_config(cfg, 8, list(SPECIALS))
    # the methods config tells dsl/mr that log_match_prob scores are log-probabilities; another score must not
    cfg = load_run_config(tiny_synth.recipe("pcme", name="pcme_bad2", model={"pcme_score": "match_prob"},
                                            eval={"similarity": "match_prob"}))
    with pytest.raises(XmrError, match="eval.rerank.dsl.scores: similarity"):
        METHODS.get("pcme").from_config(cfg, 8, list(SPECIALS))


def test_pcme_trains_scores_and_is_deterministic(tiny_synth, tmp_path):
    cfg = load_run_config(tiny_synth.recipe("pcme", train={"epochs": 2}, model={"attention_hidden": 16}))
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["best_epoch"] in (1, 2) and np.isfinite(summary["history"][-1]["loss"])
    sims, info = score_split(tmp_path / "run", progress=False)
    assert sims.shape == (12, 60) and info["split"] == "test"
    assert np.isfinite(sims).all() and sims.max() <= 0.0  # log-probabilities (log_match_prob, the default)
    again, _ = score_split(tmp_path / "run", progress=False)
    np.testing.assert_array_equal(sims, again)


def test_caption_word_drop_runs_in_training_mode_only(tiny_synth):
    # released tokenize with caption_drop_prob p: words -> <unk> with prob p, then floor(p·n) words deleted;
    # p = 1 turns every word into <unk> and then deletes all n of them: the caption is <start> <end>
    model = _tiny_model(tiny_synth, text_augment=1.0)
    assert model.model_settings.text_augment_style == "unk_then_delete"
    _, _, text = _tiny_batch(model)
    empty = model.text.collate(["", "", ""], [[], [], []])
    model.eval()
    with torch.no_grad():
        mu_eval, ls_eval = model.text_distribution(text)
        mu_empty, ls_empty = model.text_distribution(empty)
        model.train()
        mu_train, ls_train = model.text_distribution(text)
    torch.testing.assert_close(mu_train, mu_empty)
    torch.testing.assert_close(ls_train, ls_empty)
    assert not torch.allclose(mu_eval, mu_empty, atol=1e-3)  # eval mode saw the words
    # and the released default rate is 0.1
    assert _tiny_model(tiny_synth).model_settings.text_augment == 0.1


def _log_prob_matrix(seed: int = 0) -> np.ndarray:
    """Log match probabilities of a small test set (6 images, 12 captions), some pairs far apart."""
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((6, 3, 4)).astype(np.float32)
    cap = np.repeat(img, 2, axis=0) + 0.3 * rng.standard_normal((12, 3, 4)).astype(np.float32)
    from xmr.similarity.measures import compute_similarity

    return np.asarray(compute_similarity(img, cap, "log_match_prob", a=1.5, b=1.0))


def test_dual_softmax_on_log_probabilities_is_log_of_dsl_on_probabilities():
    from xmr.rerank import rerank

    lp = _log_prob_matrix()
    p = np.exp(lp.astype(np.float64))
    tau = 100.0
    i2t, t2i = rerank(lp, "dsl", {"scale": tau, "scores": "log_prob"})
    n, m = p.shape
    # DSL on probabilities, by the formula: p[i, j]·exp(τ p[i, j]) / Σ_l exp(τ p[l, j]) (columns for i2t)
    col = np.array([[p[i, j] * math.exp(tau * p[i, j]) / sum(math.exp(tau * p[l, j]) for l in range(n))
                     for j in range(m)] for i in range(n)])
    row = np.array([[p[i, j] * math.exp(tau * p[i, j]) / sum(math.exp(tau * p[i, l]) for l in range(m))
                     for j in range(m)] for i in range(n)])
    np.testing.assert_allclose(i2t.numpy(), np.log(col), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(t2i.numpy(), np.log(row), rtol=1e-4, atol=1e-4)
    # read as plain similarities, all-negative scores would invert the prior: refused with the way out
    with pytest.raises(XmrError, match="scores=log_prob"):
        rerank(lp, "dsl", {"scale": tau})
    with pytest.raises(XmrError, match="not log-probabilities"):
        rerank(p, "dsl", {"scale": tau, "scores": "log_prob"})


def test_mr_on_log_probabilities_normalises_the_probabilities():
    from xmr.rerank import rerank

    lp = _log_prob_matrix(seed=1)
    p = np.exp(lp.astype(np.float64))
    # the same re-ranking as MR on the probabilities themselves (its linear normalisation p / Σ p)
    got_i2t, got_t2i = rerank(lp, "mr", {"k": 3, "outside": "zero", "scores": "log_prob"})
    want_i2t, want_t2i = rerank(p.astype(np.float32), "mr", {"k": 3, "outside": "zero"})
    np.testing.assert_allclose(got_i2t.numpy(), want_i2t.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_t2i.numpy(), want_t2i.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(XmrError, match="re-ranker 'mr': every similarity is <= 0"):
        rerank(lp, "mr", {"k": 3})


def test_all_negative_cosines_are_not_mistaken_for_log_probabilities():
    """A cosine matrix whose scores all lie in [-1, 0] (CODER's on synth: -0.67 to -0.25) is re-ranked as the
    reference DSL does (A · prior); only scores below -1 (outside the cosine range) are refused as log-probabilities."""
    from xmr.rerank import rerank

    a = np.array([[-0.25, -0.5], [-0.6, -0.3]], dtype=np.float32)
    with pytest.warns(UserWarning, match=r"re-ranker 'dsl': every similarity is <= 0 \(cosines in \[-0.6, -0.25\]\)"):
        i2t, _ = rerank(a, "dsl", {"scale": 1.0})
    # column j: prior_i = e^{a_ij} / Σ_l e^{a_lj}; col 0: e^-0.25 / (e^-0.25 + e^-0.6) = 0.58662, 0.41338
    assert np.allclose(i2t.numpy()[:, 0], [-0.25 * 0.586618, -0.6 * 0.413382], atol=1e-5)
    with pytest.raises(XmrError, match="every similarity is <= 0"):
        rerank(a - 1.5, "dsl", {"scale": 1.0})
