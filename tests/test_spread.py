"""Spread of a similarity matrix (xmr/evaluation/spread.py) on hand-built matrices."""

import math

import numpy as np
import pytest

from xmr.evaluation.spread import similarity_spread

# 2 images x 4 captions, 2 captions per image: captions 0, 1 belong to image 0, captions 2, 3 to image 1
S = np.array([[0.9, 0.5, 0.7, 0.1],
              [0.2, 0.6, 0.8, 0.4]])


def test_spread_of_a_hand_built_matrix():
    out = similarity_spread(S, captions_per_image=2)
    # mean 4.2 / 8 = 0.525; squared deviations 0.140625 + 0.000625 + 0.030625 + 0.180625 + 0.105625 + 0.005625
    #   + 0.075625 + 0.015625 = 0.555 => population std sqrt(0.555 / 8)
    assert out["mean"] == pytest.approx(0.525, abs=1e-12)
    assert out["std"] == pytest.approx(math.sqrt(0.555 / 8), abs=1e-12)
    assert (out["min"], out["max"]) == (pytest.approx(0.1), pytest.approx(0.9))
    # image queries: best positive - hardest negative: image 0: 0.9 - max(0.7, 0.1) = 0.2; image 1: 0.8 - 0.6 = 0.2
    assert out["margin_i2t"] == pytest.approx(0.2, abs=1e-12)
    # caption queries (one positive, the other image the negative): 0.9 - 0.2 = 0.7, 0.5 - 0.6 = -0.1,
    #   0.8 - 0.7 = 0.1, 0.4 - 0.1 = 0.3 => mean 0.25
    assert out["margin_t2i"] == pytest.approx(0.25, abs=1e-12)
    assert out["margin"] == pytest.approx(0.225, abs=1e-12)


def test_a_collapsed_matrix_has_no_spread_and_no_margin():
    out = similarity_spread(np.full((3, 6), 0.987), captions_per_image=2)
    assert out["std"] == pytest.approx(0.0, abs=1e-12) and out["margin"] == pytest.approx(0.0, abs=1e-12)
    assert out["mean"] == pytest.approx(0.987, abs=1e-12)


def test_in_batch_top1_counts_pairs_first_in_their_row_and_column():
    from xmr.evaluation.spread import in_batch_top1

    # 4 images x 2 captions each; positives score 1, negatives 0, except that image 1 scores image 0's captions 2:
    # in the 4 x 4 block, image 0's caption has a larger score in row 1 (column miss) and image 1's row maximum is
    # image 0's caption (row miss); images 2 and 3 are first in row and column -> 2 of 4 = 0.5, whichever caption
    # of each image is drawn.
    s = np.zeros((4, 8))
    for i in range(4):
        s[i, 2 * i:2 * i + 2] = 1.0
    s[1, 0:2] = 2.0
    assert in_batch_top1(s, 2, batch=4, batches=5) == 0.5
    assert in_batch_top1(np.full((4, 8), 0.9), 2, batch=4) == 0.0  # collapsed: every entry ties
    with pytest.raises(ValueError, match="batch 5 is larger than the 4 images"):
        in_batch_top1(s, 2, batch=5)
