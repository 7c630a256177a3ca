"""Metrics and ranks against hand-computed cases and independent naive (sorting) formulations."""

from __future__ import annotations

import numpy as np
import pytest

from xmr.core.errors import XmrError
from xmr.evaluation import evaluate_sims, i2t_ranks, label_ranks, recall_metrics, t2i_ranks

# 2 images x 2 captions each: image 0 owns captions 0, 1; image 1 owns captions 2, 3.
HAND = np.array([[0.9, 0.1, 0.8, 0.3],
                 [0.2, 0.7, 0.6, 0.5]], dtype=np.float32)


def test_recall_metrics_by_hand():
    m = recall_metrics([0, 3, 7, 12])
    assert m == {"r1": 25.0, "r5": 50.0, "r10": 75.0, "medr": 6.0, "meanr": 6.5}  # median 5 -> floor 5 + 1
    assert recall_metrics([0, 1])["medr"] == 1.0  # median 0.5 -> floor 0, + 1


def test_hand_matrix_ranks_and_metrics():
    # image 0: row sorted 0.9(c0) 0.8(c2) 0.3 0.1 -> GT c0 at 0; image 1: 0.7(c1) 0.6(c2) -> GT c2 at 1
    assert i2t_ranks(HAND, 2).tolist() == [0, 1]
    # caption columns: c0 [0.9, 0.2] -> 0; c1 [0.1, 0.7] -> 1; c2 [0.8, 0.6] -> 1; c3 [0.3, 0.5] -> 0
    assert t2i_ranks(HAND, 2).tolist() == [0, 1, 1, 0]
    m = evaluate_sims(HAND, "plain", captions_per_image=2)
    assert m["i2t"] == {"r1": 50.0, "r5": 100.0, "r10": 100.0, "medr": 1.0, "meanr": 1.5}
    assert m["t2i"] == {"r1": 50.0, "r5": 100.0, "r10": 100.0, "medr": 1.0, "meanr": 1.5}
    assert m["rsum"] == 500.0
    assert m["ties"] == "pessimistic" and m["rerank"] == "none" and m["captions_per_image"] == 2


def test_constant_matrix_tie_policies():
    s = np.zeros((2, 4), dtype=np.float32)  # every score tied
    # i2t: 2 irrelevant captions tie with the GT; index: image 1's first GT (col 2) comes after cols 0, 1
    assert i2t_ranks(s, 2, "pessimistic").tolist() == [2, 2]
    assert i2t_ranks(s, 2, "optimistic").tolist() == [0, 0]
    assert i2t_ranks(s, 2, "index").tolist() == [0, 2]
    # t2i: one other image ties; index: image 1 comes after image 0
    assert t2i_ranks(s, 2, "pessimistic").tolist() == [1, 1, 1, 1]
    assert t2i_ranks(s, 2, "optimistic").tolist() == [0, 0, 0, 0]
    assert t2i_ranks(s, 2, "index").tolist() == [0, 0, 1, 1]
    # a collapsed model must not look perfect under the default policy
    assert evaluate_sims(s, "plain", 2)["i2t"]["r1"] == 0.0


def test_partial_ties_by_hand():
    s = np.array([[0.5, 0.2, 0.5, 0.9],    # GT 0,1: best 0.5; 0.9 above; col 2 tied (irrelevant)
                  [0.5, 0.1, 0.5, 0.3],    # GT 2,3: best 0.5 at col 2; col 0 tied and before it
                  ], dtype=np.float32)
    assert i2t_ranks(s, 2, "pessimistic").tolist() == [2, 1]
    assert i2t_ranks(s, 2, "optimistic").tolist() == [1, 0]
    assert i2t_ranks(s, 2, "index").tolist() == [1, 1]
    # two GT captions tied with each other and with one irrelevant caption: only the irrelevant one counts
    s2 = np.array([[0.4, 0.4, 0.4, 0.1], [0.0, 0.0, 0.3, 0.2]], dtype=np.float32)
    assert i2t_ranks(s2, 2, "pessimistic").tolist() == [1, 0]


def _naive_rank(scores, relevant, ties):
    """Sort the gallery explicitly with the tie policy as a secondary key; position of the first relevant item."""
    items = range(len(scores))
    if ties == "pessimistic":
        key = lambda j: (-scores[j], relevant[j])  # noqa: E731 (irrelevant first among ties)
    elif ties == "optimistic":
        key = lambda j: (-scores[j], not relevant[j])  # noqa: E731
    else:
        key = lambda j: (-scores[j], j)  # noqa: E731
    order = sorted(items, key=key)
    return next(p for p, j in enumerate(order) if relevant[j])


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "index"])
def test_ranks_match_naive_sort_with_heavy_ties(ties):
    rng = np.random.default_rng(1)
    n, c = 12, 3
    s = rng.integers(0, 4, size=(n, n * c)).astype(np.float32) / 4  # 4 distinct values: many ties
    exp_i2t = [_naive_rank(s[i], [j // c == i for j in range(n * c)], ties) for i in range(n)]
    exp_t2i = [_naive_rank(s[:, j], [i == j // c for i in range(n)], ties) for j in range(n * c)]
    assert i2t_ranks(s, c, ties).tolist() == exp_i2t
    assert t2i_ranks(s, c, ties).tolist() == exp_t2i


def test_matches_reference_argsort_without_ties():
    """VSE∞ lib/evaluation.py semantics (argsort reversed, best of the image's captions), rewritten here."""
    rng = np.random.default_rng(2)
    n, c = 30, 5
    s = rng.standard_normal((n, n * c)).astype(np.float32)
    ref_i2t = [min(np.where(np.argsort(s[i])[::-1] == j)[0][0] for j in range(c * i, c * i + c)) for i in range(n)]
    ref_t2i = [np.where(np.argsort(s[:, j])[::-1] == j // c)[0][0] for j in range(n * c)]
    for ties in ("pessimistic", "optimistic", "index"):
        assert i2t_ranks(s, c, ties).tolist() == ref_i2t
        assert t2i_ranks(s, c, ties).tolist() == ref_t2i
    m = evaluate_sims(s, "plain", c)
    r = np.array(ref_i2t, dtype=float)
    assert m["i2t"]["r1"] == pytest.approx(100 * np.mean(r < 1))
    assert m["i2t"]["medr"] == np.floor(np.median(r)) + 1
    assert m["i2t"]["meanr"] == pytest.approx(r.mean() + 1)


def test_coco1k_is_the_plain_mean_of_five_folds():
    # Built so each fold has a different, known result: in fold f the first 200(f+1) of its 1000 images score 1 with
    # their own 5 captions ("hits", rank 0); everything else is 0, so a miss ties with every caption of its fold.
    n, c = 5000, 5
    s = np.zeros((n, n * c), dtype=np.float32)
    hits = np.array([(i % 1000) < 200 * (i // 1000 + 1) for i in range(n)])
    for i in np.nonzero(hits)[0]:
        s[i, c * i:c * i + c] = 1.0
    m = evaluate_sims(s, "coco1k", 5)
    assert [f["i2t"]["r1"] for f in m["folds"]] == [20.0, 40.0, 60.0, 80.0, 100.0]
    # misses rank behind the fold's 4995 other captions (pessimistic); medr per fold 4996, 4996, 1, 1, 1
    assert [f["i2t"]["medr"] for f in m["folds"]] == [4996.0, 4996.0, 1.0, 1.0, 1.0]
    assert m["i2t"]["r1"] == pytest.approx(60.0)
    assert m["i2t"]["medr"] == pytest.approx((4996 * 2 + 3) / 5)  # the mean of the folds' medr, not a pooled median
    assert m["i2t"]["meanr"] == pytest.approx(np.mean([(1 - p) * 4995 + 1 for p in (0.2, 0.4, 0.6, 0.8, 1.0)]))
    # t2i: a miss's caption column is all 0 within its fold: rank 999 of 1000 images
    assert [f["t2i"]["r1"] for f in m["folds"]] == [20.0, 40.0, 60.0, 80.0, 100.0]
    assert m["t2i"]["meanr"] == pytest.approx(np.mean([(1 - p) * 999 + 1 for p in (0.2, 0.4, 0.6, 0.8, 1.0)]))
    assert m["rsum"] == pytest.approx(np.mean([f["rsum"] for f in m["folds"]]))
    # the same matrix under 5K: misses rank behind 24,995 captions, and the pooled median is a hit (rank 0)
    m5 = evaluate_sims(s, "coco5k", 5)
    assert m5["i2t"]["r1"] == pytest.approx(60.0) and m5["i2t"]["medr"] == 1.0
    assert m5["i2t"]["meanr"] == pytest.approx(0.4 * 24995 + 1)
    assert "folds" not in m5


def test_cub_r_precision_by_hand():
    li = np.array([0, 0, 1])
    lc = np.array([0, 1, 0, 1])
    s = np.array([[0.9, 0.8, 0.1, 0.3],
                  [0.2, 0.1, 0.7, 0.6],
                  [0.5, 0.4, 0.3, 0.2]], dtype=np.float32)
    m = evaluate_sims(s, "cub", image_labels=li, caption_labels=lc)
    # i2t: R=2,2,2; top-2 hold 1 relevant each; top-1 relevant for images 0, 1 only
    assert m["i2t"]["r_precision"] == pytest.approx(50.0)
    assert m["i2t"]["r1"] == pytest.approx(200 / 3)
    # t2i: captions 0, 2 (R=2) get 1/2; captions 1, 3 (R=1) get 0
    assert m["t2i"]["r_precision"] == pytest.approx(25.0)
    assert m["t2i"]["r1"] == pytest.approx(50.0)
    assert "rsum" not in m


def _naive_r_precision(scores, relevant, ties):
    r = int(sum(relevant))
    items = range(len(scores))
    key = {"pessimistic": lambda j: (-scores[j], relevant[j]), "optimistic": lambda j: (-scores[j], not relevant[j]),
           "index": lambda j: (-scores[j], j)}[ties]
    top = sorted(items, key=key)[:r]
    return sum(relevant[j] for j in top) / r


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "index"])
def test_cub_metrics_match_naive_with_ties(ties):
    rng = np.random.default_rng(3)
    n, c = 15, 4
    li = rng.integers(0, 4, n)
    lc = np.repeat(li, c)
    s = rng.integers(0, 5, size=(n, n * c)).astype(np.float32)
    i2t_rank, i2t_rp, t2i_rank, t2i_rp = label_ranks(s, li, lc, ties)
    for i in range(n):
        rel = [bool(lc[j] == li[i]) for j in range(n * c)]
        assert i2t_rank[i] == _naive_rank(s[i], rel, ties)
        assert i2t_rp[i] == pytest.approx(_naive_r_precision(s[i], rel, ties))
    for j in range(n * c):
        rel = [bool(li[i] == lc[j]) for i in range(n)]
        assert t2i_rank[j] == _naive_rank(s[:, j], rel, ties)
        assert t2i_rp[j] == pytest.approx(_naive_r_precision(s[:, j], rel, ties))
    # labels default to the image labels repeated per caption
    a = evaluate_sims(s, "cub", c, image_labels=li, ties=ties)
    b = evaluate_sims(s, "cub", c, image_labels=li, caption_labels=lc, ties=ties)
    assert a["i2t"] == b["i2t"] and a["t2i"] == b["t2i"]


@pytest.mark.parametrize("bad, msg", [
    (np.array([[0.1, np.nan, 0.2, 0.3], [0, 0, 0, 0]], dtype=np.float32), "1 NaN and 0 inf"),
    (np.array([[0.1, np.inf, 0.2, 0.3], [0, 0, 0, -np.inf]], dtype=np.float32), "0 NaN and 2 inf"),
])
def test_non_finite_matrix_is_rejected(bad, msg):
    with pytest.raises(XmrError, match=msg):
        evaluate_sims(bad, "plain", 2)


def test_shape_errors():
    with pytest.raises(XmrError, match="not divisible by captions-per-image 3"):
        evaluate_sims(np.zeros((2, 10), np.float32), "plain", 3)
    with pytest.raises(XmrError, match="make 5 images, but the matrix has 2"):
        evaluate_sims(np.zeros((2, 10), np.float32), "plain", 2)
    for proto, shape in (("coco1k", "5000 x 25000"), ("coco5k", "5000 x 25000"), ("f30k", "1000 x 5000")):
        with pytest.raises(XmrError, match=f"protocol {proto} needs a {shape} matrix"):
            evaluate_sims(np.zeros((2, 10), np.float32), proto, 5)
    with pytest.raises(XmrError, match="has 5 captions per image"):
        evaluate_sims(np.zeros((1000, 5000), np.float32), "f30k", 4)
    with pytest.raises(XmrError, match="unknown protocol"):
        evaluate_sims(HAND, "coco2k", 2)
    with pytest.raises(XmrError, match="unknown tie policy"):
        evaluate_sims(HAND, "plain", 2, ties="random")
    with pytest.raises(XmrError, match="needs image class labels"):
        evaluate_sims(HAND, "cub", 2)


def test_subsets_average_the_same_ranks_over_their_queries_only():
    from xmr.evaluation import evaluate_sims

    # 2 images x 2 captions each; captions 0, 1 -> image 0, captions 2, 3 -> image 1
    sims = np.array([[0.9, 0.1, 0.8, 0.2],
                     [0.5, 0.6, 0.7, 0.3]])
    # i2t: image 0's best caption 0 (0.9) is first in its row; image 1's caption 2 (0.7) is first => ranks 0, 0
    # t2i columns: c0 [0.9, 0.5] -> 0; c1 [0.1, 0.6] -> 1; c2 [0.8, 0.7] -> 1; c3 [0.2, 0.3] -> 0
    sub = {"hard": {"images": np.array([False, True]), "captions": np.array([False, True, True, False])}}
    res = evaluate_sims(sims, "plain", captions_per_image=2, subsets=sub)
    assert res["t2i"]["r1"] == pytest.approx(50.0)
    s = res["subsets"]["hard"]
    assert (s["n_images"], s["n_captions"]) == (1, 2)
    assert s["i2t"]["r1"] == pytest.approx(100.0)
    assert s["t2i"]["r1"] == pytest.approx(0.0) and s["t2i"]["r5"] == pytest.approx(100.0)
    assert s["t2i"]["medr"] == pytest.approx(2.0)  # ranks 1, 1 (0-based)
    assert s["rsum"] == pytest.approx(500.0)
    with pytest.raises(Exception, match="masks of 3 images"):
        evaluate_sims(sims, "plain", captions_per_image=2,
                      subsets={"bad": {"images": np.ones(3, bool), "captions": np.ones(4, bool)}})
