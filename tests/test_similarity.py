"""Similarity measures against hand-computed values and naive per-pair formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xmr.core.errors import XmrError
from xmr.similarity.measures import SIMILARITIES, compute_similarity, set_similarity


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _naive(images, captions, measure, alpha=16.0, a=5.0, b=5.0):
    """Per-pair loops in float64, written from the formulas in the method cards."""
    X = images if images.ndim == 3 else images[:, None]
    Y = captions if captions.ndim == 3 else captions[:, None]
    out = np.zeros((len(X), len(Y)))
    for i, xs in enumerate(X):
        for j, ys in enumerate(Y):
            if measure == "match_prob":
                vals = []
                for x in xs:
                    for y in ys:
                        z = -a * np.linalg.norm(x - y) + b
                        vals.append(math.exp(z) / (math.exp(z) + math.exp(-z)))
                out[i, j] = np.mean(vals)
                continue
            c = np.array([[float(np.dot(x, y)) for y in _unit(ys)] for x in _unit(xs)])  # K x L cosines
            k, l = c.shape
            if measure in ("cosine", "max"):
                out[i, j] = c.max()
            elif measure == "mean":
                out[i, j] = c.mean()
            elif measure == "chamfer":
                out[i, j] = sum(c[x].max() for x in range(k)) / (2 * k) + sum(c[:, y].max() for y in range(l)) / (2 * l)
            elif measure == "smooth_chamfer":
                lse_x = sum(math.log(sum(math.exp(alpha * c[x, y]) for y in range(l))) for x in range(k))
                lse_y = sum(math.log(sum(math.exp(alpha * c[x, y]) for x in range(k))) for y in range(l))
                out[i, j] = lse_x / (2 * alpha * k) + lse_y / (2 * alpha * l)
    return out


def test_hand_values():
    x = np.array([[1.0, 0.0]], dtype=np.float32)
    y = np.array([[0.6, 0.8]], dtype=np.float32)
    assert compute_similarity(x, y).item() == pytest.approx(0.6)
    X = np.array([[[1.0, 0.0], [0.0, 1.0]]], dtype=np.float32)  # one image set {e1, e2}; cosines with y: 0.6, 0.8
    assert compute_similarity(X, y, "max").item() == pytest.approx(0.8)
    assert compute_similarity(X, y, "mean").item() == pytest.approx(0.7)
    # Chamfer: (0.6 + 0.8) / (2*2) + max(0.6, 0.8) / (2*1) = 0.35 + 0.4
    assert compute_similarity(X, y, "chamfer").item() == pytest.approx(0.75)
    # smooth Chamfer, α = 1: (0.6 + 0.8) / 4 + log(e^0.6 + e^0.8) / 2
    expected = 0.35 + 0.5 * math.log(math.exp(0.6) + math.exp(0.8))
    assert compute_similarity(X, y, "smooth_chamfer", alpha=1.0).item() == pytest.approx(expected, rel=1e-6)
    # match probability of identical points: σ(b) with PCME's σ(z) = e^z / (e^z + e^-z)
    p = compute_similarity(y, y, "match_prob", a=2.0, b=0.5).item()
    assert p == pytest.approx(math.exp(0.5) / (math.exp(0.5) + math.exp(-0.5)), rel=1e-6)


@pytest.mark.parametrize("measure", ["max", "mean", "chamfer", "smooth_chamfer", "match_prob"])
def test_sets_match_naive(measure):
    rng = np.random.default_rng(0)
    imgs = rng.standard_normal((4, 3, 6)).astype(np.float32)
    caps = rng.standard_normal((5, 2, 6)).astype(np.float32)
    a, b = (0.7, 1.5)
    kw = {"a": a, "b": b} if measure == "match_prob" else {"alpha": 4.0}
    got = np.asarray(compute_similarity(imgs, caps, measure, **kw))
    assert got.dtype == np.float32 and got.shape == (4, 5)
    np.testing.assert_allclose(got, _naive(imgs, caps, measure, alpha=4.0, a=a, b=b), rtol=1e-5, atol=1e-6)


def test_cosine_and_dvse_sub_embeddings_vs_single_captions():
    rng = np.random.default_rng(1)
    imgs = rng.standard_normal((5, 7)).astype(np.float32)
    caps = rng.standard_normal((8, 7)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(compute_similarity(imgs, caps)), _naive(imgs, caps, "cosine"), atol=1e-6)
    subs = rng.standard_normal((5, 6, 7)).astype(np.float32)  # DVSE: K=6 sub-embeddings vs one caption vector
    expected = np.array([[max(float(np.dot(_unit(s), _unit(c))) for s in subs[i]) for c in caps] for i in range(5)])
    np.testing.assert_allclose(np.asarray(compute_similarity(subs, caps, "max")), expected, atol=1e-6)


def test_blocking_does_not_change_results():
    rng = np.random.default_rng(2)
    imgs = rng.standard_normal((9, 3, 5)).astype(np.float32)
    caps = rng.standard_normal((11, 2, 5)).astype(np.float32)
    for measure in ("max", "chamfer", "smooth_chamfer", "mean"):
        full = compute_similarity(imgs, caps, measure)
        tiny = compute_similarity(imgs, caps, measure, chunk_size=2, block_bytes=64)  # splits captions too
        torch.testing.assert_close(full, tiny)


def test_smooth_chamfer_properties():
    """DivE card §3.1: symmetric, the cosine for singletons, between Chamfer and Chamfer + (log K + log L)/(2α)."""
    rng = np.random.default_rng(3)
    X = torch.tensor(rng.standard_normal((3, 4, 8)), dtype=torch.float64)
    Y = torch.tensor(rng.standard_normal((5, 4, 8)), dtype=torch.float64)
    alpha = 16.0
    sc = set_similarity(X, Y, "smooth_chamfer", alpha)
    torch.testing.assert_close(sc, set_similarity(Y, X, "smooth_chamfer", alpha).T)
    ch = set_similarity(X, Y, "chamfer")
    assert bool((ch <= sc + 1e-12).all()) and bool((sc <= ch + (2 * math.log(4)) / (2 * alpha) + 1e-12).all())
    torch.testing.assert_close(set_similarity(X, Y, "smooth_chamfer", 1e4), ch, atol=1e-3, rtol=0)
    x1, y1 = X[:, :1], Y[:, :1]
    torch.testing.assert_close(set_similarity(x1, y1, "smooth_chamfer", alpha), set_similarity(x1, y1, "cosine"))


def test_set_similarity_is_differentiable():
    rng = np.random.default_rng(4)
    X = torch.tensor(rng.standard_normal((2, 3, 4)), dtype=torch.float64, requires_grad=True)
    Y = torch.tensor(rng.standard_normal((3, 2, 4)), dtype=torch.float64, requires_grad=True)
    for measure, kw in (("smooth_chamfer", {"alpha": 4.0}), ("mean", {}), ("match_prob", {"a": 1.0, "b": 0.5})):
        assert torch.autograd.gradcheck(lambda x, y: set_similarity(x, y, measure, **kw), (X, Y))


def _log_sigmoid(x: float) -> float:
    """log logistic(x) in float64, exact for large |x|."""
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def test_log_match_prob_by_hand_one_sample():
    # J = 1: image sample at the origin, caption samples at distances 5 and 1 (3-4-5 and unit vectors)
    x = np.zeros((1, 1, 2), np.float32)
    y = np.array([[[3.0, 4.0]], [[0.0, 1.0]]], np.float32)
    a, b = 1.0, 2.0
    got = np.asarray(compute_similarity(x, y, "log_match_prob", a=a, b=b))[0]
    # PCME σ(z) = logistic(2z): log σ(b - a·5) = log logistic(-6) = -log(1 + e^6); log σ(b - a) = log logistic(2)
    want = [-math.log1p(math.exp(6.0)), -math.log1p(math.exp(-2.0))]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0] == pytest.approx(-6.0024757, abs=1e-6) and got[1] == pytest.approx(-0.1269280, abs=1e-6)
    # J×L samples: the log of the mean of the J×L probabilities (image samples at distances 1 and 5 of the caption)
    xs = np.array([[[0.0, 0.0], [0.0, 6.0]]], np.float32)
    ys = np.array([[[0.0, 1.0]]], np.float32)
    got2 = compute_similarity(xs, ys, "log_match_prob", a=a, b=b).item()
    assert got2 == pytest.approx(math.log((math.exp(_log_sigmoid(2.0)) + math.exp(_log_sigmoid(-6.0))) / 2), rel=1e-6)


def test_log_match_prob_orders_pairs_whose_probability_underflows():
    # captions 100, 200 and 300 away from the image: logistic arguments 2(b - a·d) ≈ -198, -398, -598, far below
    # float32's exp range, so every match probability is exactly 0 and the three pairs tie
    x = np.zeros((1, 2, 3), np.float32)
    y = np.stack([np.tile(np.array([d, 0.0, 0.0], np.float32), (2, 1)) for d in (200.0, 100.0, 300.0)])
    a, b = 1.0, 1.0
    assert np.asarray(compute_similarity(x, y, "match_prob", a=a, b=b)).tolist() == [[0.0, 0.0, 0.0]]
    got = np.asarray(compute_similarity(x, y, "log_match_prob", a=a, b=b))[0]
    # all J×L = 4 pairs at the same distance d: log mean = log σ(b - a·d) = log logistic(2(1 - d)) ≈ 2(1 - d)
    np.testing.assert_allclose(got, [2 * (1 - 200.0), 2 * (1 - 100.0), 2 * (1 - 300.0)], rtol=1e-6)
    assert np.argsort(-got).tolist() == [1, 0, 2]  # the closest caption first
    # the differentiable batch form agrees
    torch.testing.assert_close(set_similarity(torch.tensor(x), torch.tensor(y), "log_match_prob", a=a, b=b)[0],
                               torch.tensor(got))


def test_log_match_prob_ranks_as_match_prob_without_underflow():
    rng = np.random.default_rng(5)
    imgs = rng.standard_normal((7, 3, 6)).astype(np.float32)
    caps = rng.standard_normal((9, 4, 6)).astype(np.float32)
    a, b = 0.8, 2.0
    p = np.asarray(compute_similarity(imgs, caps, "match_prob", a=a, b=b))
    lp = np.asarray(compute_similarity(imgs, caps, "log_match_prob", a=a, b=b))
    assert p.min() > 1e-6  # no underflow here
    np.testing.assert_allclose(lp, np.log(_naive(imgs, caps, "match_prob", a=a, b=b)), rtol=1e-5, atol=1e-6)
    # equal rankings in both directions (stable sorts; no ties in continuous data)
    assert (np.argsort(-lp, axis=1, kind="stable") == np.argsort(-p, axis=1, kind="stable")).all()
    assert (np.argsort(-lp, axis=0, kind="stable") == np.argsort(-p, axis=0, kind="stable")).all()
    # blocks and the differentiable form give the same values
    tiny = compute_similarity(imgs, caps, "log_match_prob", chunk_size=2, block_bytes=64, a=a, b=b)
    np.testing.assert_allclose(tiny, lp, rtol=1.3e-6, atol=1e-5)  # torch.testing.assert_close's float32 tolerances
    X = torch.tensor(imgs[:2], dtype=torch.float64, requires_grad=True)
    Y = torch.tensor(caps[:3], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda u, v: set_similarity(u, v, "log_match_prob", a=a, b=b), (X, Y))


def test_registry_and_errors():
    assert set(SIMILARITIES.names()) == {"cosine", "max", "mean", "chamfer", "smooth_chamfer", "match_prob",
                                         "log_match_prob"}
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(XmrError, match="compares single vectors"):
        compute_similarity(x, np.ones((2, 4), np.float32), "cosine")
    with pytest.raises(XmrError, match="embedding sizes differ"):
        compute_similarity(np.ones((2, 4), np.float32), np.ones((2, 5), np.float32))
    bad = np.ones((2, 4), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(XmrError, match="NaN or inf"):
        compute_similarity(bad, np.ones((2, 4), np.float32))
    with pytest.raises(XmrError, match="unknown similarity measure"):
        compute_similarity(bad, bad, "cosinus")
    with pytest.raises(XmrError, match="has no parameter"):
        compute_similarity(x, x, "max", a=1.0)
