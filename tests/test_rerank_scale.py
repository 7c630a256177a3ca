"""Re-rankers judged with their scale (xmr/rerank/standardised.py): on a collapsed matrix (every score in a band
0.01 wide) the ``_val`` readings equal the paper's re-ranker on the affinely rescaled matrix, worked out from the
formulas."""

import numpy as np
import pytest

from xmr.core.errors import XmrError
from xmr.rerank import rerank

# 3 images x 6 captions (2 per image), every similarity in [0.980, 0.990]
A = np.array([[0.989, 0.987, 0.981, 0.983, 0.984, 0.980],
              [0.982, 0.985, 0.990, 0.988, 0.981, 0.983],
              [0.984, 0.980, 0.983, 0.982, 0.989, 0.986]])
VAL = {"val_mean": 0.985, "val_std": 0.002}  # validation statistics: std 0.002 -> factor 0.1 / 0.002 = 50


def rescaled() -> np.ndarray:
    # A' = 0.985 + (A - 0.985) * 50: e.g. 0.989 -> 1.185, 0.980 -> 0.735
    return 0.985 + (A - 0.985) * 50.0


def fr_formula(a: np.ndarray, g1: float, g2: float, l1: float, l2: float) -> tuple[np.ndarray, np.ndarray]:
    """DVSE Eqs. 13-15 in log space: i2t normalises each column over the images, t2i each row over the captions."""
    col = np.log(np.exp(g1 * a).sum(0))
    row = np.log(np.exp(l1 * a).sum(1))
    return g2 * a - col[None, :], l2 * a - row[:, None]


def test_fr_val_is_fr_on_the_rescaled_matrix():
    assert rescaled()[0, 0] == pytest.approx(1.185) and rescaled()[0, 5] == pytest.approx(0.735)
    i2t, t2i = rerank(A, "fr_val", VAL)  # the paper's defaults: γ1 = γ2 = 25, λ1 = λ2 = 20
    want_i2t, want_t2i = fr_formula(rescaled(), 25.0, 25.0, 20.0, 20.0)
    np.testing.assert_allclose(i2t.numpy(), want_i2t, atol=1e-4)
    np.testing.assert_allclose(t2i.numpy(), want_t2i, atol=1e-4)
    # on the collapsed matrix itself FR's scores span under 0.3 (25 x a band of 0.01); rescaled, about 11
    plain_i2t, _ = rerank(A, "fr")
    assert np.ptp(plain_i2t.numpy()) < 0.3 and np.ptp(i2t.numpy()) > 10


def test_the_other_readings_rescale_the_same_way():
    a2 = rescaled()
    i2t, t2i = rerank(A, "isoftmax_val", VAL | {"beta": 20.0})
    want_i2t, want_t2i = fr_formula(a2, 20.0, 20.0, 20.0, 20.0)  # the inverted softmax is FR with one β
    np.testing.assert_allclose(i2t.numpy(), want_i2t, atol=1e-4)
    np.testing.assert_allclose(t2i.numpy(), want_t2i, atol=1e-4)
    # DSL: A' x softmax over the queries of τ·A' (τ = 100): image->text over the column's images
    i2t, t2i = rerank(A, "dsl_val", VAL)
    prior_col = np.exp(100 * a2) / np.exp(100 * a2).sum(0, keepdims=True)
    prior_row = np.exp(100 * a2) / np.exp(100 * a2).sum(1, keepdims=True)
    np.testing.assert_allclose(i2t.numpy(), a2 * prior_col, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(t2i.numpy(), a2 * prior_row, rtol=1e-4, atol=1e-6)


def test_without_validation_statistics_it_says_what_to_do():
    with pytest.raises(XmrError, match="val_std=0.0 must be > 0"):
        rerank(A, "fr_val")


def test_a_reading_is_a_target_suffix(tmp_path):
    from xmr.run.layout import parse_target

    (tmp_path / "recipes" / "synth").mkdir(parents=True)
    (tmp_path / "recipes" / "synth" / "dvse.yaml").write_text("method: dvse\n")
    assert parse_target("synth", "dvse_fr_val", tmp_path) == ("dvse", "fr_val")
    assert parse_target("synth", "dvse_fr", tmp_path) == ("dvse", "fr")
