"""VSE++ bidirectional hinge loss (hardest negative and sum of hinges) against hand-computed values, including
sibling captions of the same image, which must not be negatives."""

import pytest
import torch

from xmr.losses.triplet import triplet_loss

# rows = images, columns = captions, matching pairs on the diagonal; batch rows 0 and 1 are the same image
# (captions 0 and 1 both describe it), so (0, 1) and (1, 0) are positives, not negatives
S = torch.tensor([[0.7, 0.65, 0.6],
                  [0.5, 0.8, 0.7],
                  [0.6, 0.3, 0.5]], dtype=torch.float64)
SIBLINGS = torch.tensor([[True, True, False],
                         [True, True, False],
                         [False, False, True]])


def test_hardest_negative_with_and_without_sibling_mask():
    # margin 0.2. With the sibling mask:
    #   image anchors (rows, positive S_ii): row 0: col 2 -> 0.2 + 0.6 - 0.7 = 0.1 (col 1 is a sibling)
    #     row 1: col 2 -> 0.2 + 0.7 - 0.8 = 0.1;  row 2: col 0 -> 0.3, col 1 -> 0.0  => max 0.3
    #   caption anchors (columns, positive S_jj): col 0: row 2 -> 0.2 + 0.6 - 0.7 = 0.1 (row 1 sibling)
    #     col 1: row 2 -> 0.2 + 0.3 - 0.8 < 0 -> 0 (row 0 sibling would give 0.05)
    #     col 2: row 0 -> 0.3, row 1 -> 0.4  => max 0.4
    #   total = (0.1 + 0.1 + 0.3) + (0.1 + 0 + 0.4) = 1.0
    assert triplet_loss(S, SIBLINGS, margin=0.2).item() == pytest.approx(1.0, abs=1e-12)
    assert triplet_loss(S, SIBLINGS, margin=0.2, reduction="mean").item() == pytest.approx(1.0 / 3, abs=1e-12)
    # diagonal only (the reference code): the siblings count as negatives
    #   rows: max(0.15, 0.1) = 0.15, max(-0.1, 0.1) = 0.1, 0.3;  cols: max(0.0, 0.1) = 0.1, max(0.05, <0) = 0.05, 0.4
    assert triplet_loss(S, margin=0.2).item() == pytest.approx(0.15 + 0.1 + 0.3 + 0.1 + 0.05 + 0.4, abs=1e-12)


def test_sum_of_hinges_with_and_without_sibling_mask():
    # VSE0: every violating negative counts. With the mask:
    #   rows: 0.1 | 0.1 | 0.3 + 0.0 = 0.5;  cols: 0.1 | 0 | 0.3 + 0.4 = 0.8  => 1.3
    assert triplet_loss(S, SIBLINGS, margin=0.2, max_violation=False).item() == pytest.approx(1.3, abs=1e-12)
    # without: rows 0.15 + 0.1 | 0 + 0.1 | 0.3 = 0.65;  cols 0 + 0.1 | 0.05 + 0 | 0.3 + 0.4 = 0.85  => 1.5
    assert triplet_loss(S, margin=0.2, max_violation=False).item() == pytest.approx(1.5, abs=1e-12)
    # margin 0: only strict violations remain: row 2 col 0 (0.6 - 0.5 = 0.1), col 2 rows 0, 1 (0.1, 0.2) => 0.4
    assert triplet_loss(S, SIBLINGS, margin=0.0, max_violation=False).item() == pytest.approx(0.4, abs=1e-12)


def test_gradient_reaches_only_the_hardest_negative_and_the_positives():
    s = S.clone().requires_grad_(True)
    triplet_loss(s, SIBLINGS, margin=0.2).backward()
    # d/dS_ij of the active hinges: +1 per time (i, j) is an active hardest negative, -1 per active hinge on a
    # positive. Active: row 0 -> (0, 2); row 1 -> (1, 2); row 2 -> (2, 0); col 0 -> (2, 0); col 2 -> (1, 2)
    # positives: S_00 (row 0, col 0), S_11 (row 1), S_22 (row 2, col 2); col 1's hinge is 0
    want = torch.tensor([[-2.0, 0.0, 1.0],
                         [0.0, -1.0, 2.0],
                         [2.0, 0.0, -2.0]], dtype=torch.float64)
    assert torch.equal(s.grad, want)


def test_reference_reductions_of_pvse_and_dive():
    # Diagonal-only positives, as both reference codes; margin 0.2. Hinge entries (diagonal zeroed):
    #   image anchors (rows):    row 0: 0.15, 0.1 | row 1: 0 (=-0.1), 0.1 | row 2: 0.3, 0 (=0.0)  -> sum 0.65
    #   caption anchors (cols):  col 0: 0, 0.1    | col 1: 0.05, 0 (<0)   | col 2: 0.3, 0.4         -> sum 0.85
    # PVSE (yalesong/pvse loss.py): loss.mean() over the whole 3 x 3 hinge matrix per direction, diagonal included
    #   => 0.65 / 9 + 0.85 / 9 = 1.5 / 9
    assert triplet_loss(S, margin=0.2, max_violation=False, reduction="mean_pairs").item() == \
        pytest.approx(1.5 / 9, abs=1e-12)
    # DivE (kdwonn/DivE loss.py): positives are cut out, loss.mean() over the 3 x 2 negatives => 1.5 / 6
    assert triplet_loss(S, margin=0.2, max_violation=False, reduction="mean_negatives").item() == \
        pytest.approx(1.5 / 6, abs=1e-12)
    # xmr's earlier "mean" (over anchors) is B or B - 1 times larger: 1.5 / 3
    assert triplet_loss(S, margin=0.2, max_violation=False, reduction="mean").item() == \
        pytest.approx(1.5 / 3, abs=1e-12)
    # hardest negative: both codes take the max per anchor, then the mean over the 3 anchors:
    #   rows 0.15, 0.1, 0.3; cols 0.1, 0.05, 0.4 => (0.55 + 0.55) / 3
    for reduction in ("mean", "mean_pairs", "mean_negatives"):
        assert triplet_loss(S, margin=0.2, reduction=reduction).item() == pytest.approx(1.1 / 3, abs=1e-12)


def test_unknown_reduction_is_refused():
    with pytest.raises(ValueError, match="mean_pairs"):
        triplet_loss(S, reduction="average")


def test_mean_negatives_counts_the_negatives_left_by_several_positives_per_anchor():
    # Two images with two captions each in the batch: rows/columns 0, 1 are image A's pairs, 2, 3 image B's, so
    # every anchor has two positives and two negatives (the other block). margin 0.2, summed hinges.
    s4 = torch.tensor([[0.9, 0.8, 0.3, 0.5],
                       [0.7, 0.6, 0.5, 0.2],
                       [0.1, 0.7, 0.8, 0.9],
                       [0.6, 0.0, 0.7, 0.4]], dtype=torch.float64)
    blocks = torch.tensor([[True, True, False, False],
                           [True, True, False, False],
                           [False, False, True, True],
                           [False, False, True, True]])
    # image anchors (rows, positive S_ii, negatives in the other block):
    #   row 0: 0.2 + 0.3 - 0.9 < 0, 0.2 + 0.5 - 0.9 < 0 -> 0 | row 1: 0.2 + 0.5 - 0.6 = 0.1, 0.2 + 0.2 - 0.6 < 0
    #   row 2: 0.2 + 0.1 - 0.8 < 0, 0.2 + 0.7 - 0.8 = 0.1   | row 3: 0.2 + 0.6 - 0.4 = 0.4, 0.2 + 0.0 - 0.4 < 0
    #   => 0.6 over 8 (anchor, negative) pairs
    # caption anchors (columns, positive S_jj):
    #   col 0: 0.2 + 0.1 - 0.9 < 0, 0.2 + 0.6 - 0.9 < 0     | col 1: 0.2 + 0.7 - 0.6 = 0.3, 0.2 + 0.0 - 0.6 < 0
    #   col 2: 0.2 + 0.3 - 0.8 < 0, 0.2 + 0.5 - 0.8 < 0     | col 3: 0.2 + 0.5 - 0.4 = 0.3, 0.2 + 0.2 - 0.4 = 0
    #   => 0.6 over 8 pairs
    # DivE's mean over the actual pairs: 0.6 / 8 + 0.6 / 8 = 0.15 (B(B-1) = 12 would give 1.2 / 12 = 0.1)
    assert triplet_loss(s4, blocks, margin=0.2, max_violation=False, reduction="mean_negatives").item() == \
        pytest.approx(0.15, abs=1e-12)
    # the 3 x 3 sibling batch: 4 negatives (the False entries); rows 0.5, cols 0.8 => 1.3 / 4
    assert triplet_loss(S, SIBLINGS, margin=0.2, max_violation=False, reduction="mean_negatives").item() == \
        pytest.approx(1.3 / 4, abs=1e-12)
