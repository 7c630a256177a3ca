"""Every re-ranker against its formula, computed naively (float64 loops / explicit sorts) in the test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xmr.core.errors import XmrError
from xmr.evaluation import evaluate_sims, i2t_ranks, t2i_ranks
from xmr.rerank import RERANKERS, RerankContext, default_params, prepare_rerank, rerank, resolve_params


def _lse(v):
    m = max(v)
    return m + math.log(sum(math.exp(x - m) for x in v))


def _matrix(n=6, c=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-0.2, 0.9, size=(n, n * c)).astype(np.float32)


def _tiny_blocks(s, name, params, c=None):
    """The same re-ranker run with a block budget of a few rows, to exercise every streaming merge."""
    sc, _ = prepare_rerank(s, name, params, c)
    tiny = RERANKERS.get(name).prepare(torch.as_tensor(s), resolve_params(name, params),
                                       RerankContext(captions_per_image=c, block_bytes=256))
    for a, b in zip(sc.materialize(), tiny.materialize()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    return sc.materialize()


def test_fr_by_hand():
    a = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    i2t, t2i = rerank(a, "fr", {"gamma1": 1, "gamma2": 1, "lambda1": 1, "lambda2": 1})
    assert i2t[0, 0].item() == pytest.approx(1 - math.log(math.e + 1))  # column (0: 1, 1: 0) normalised over images
    assert i2t[1, 0].item() == pytest.approx(0 - math.log(math.e + 1))
    assert t2i[0, 1].item() == pytest.approx(0 - math.log(1 + math.e))  # row normalised over captions


def test_fr_demotes_a_hub_caption_by_hand():
    # caption 0 is a hub: it is image 1's best caption, but image 0 likes it even more. One caption per image.
    a = np.array([[0.9, 0.5], [0.8, 0.75]], dtype=np.float32)
    assert evaluate_sims(a, "plain", 1)["i2t"]["r1"] == 50.0  # image 1 ranks caption 0 first
    # γ1 = γ2 = 10: column log-sum-exps log(e^9 + e^8) = 9.31326, log(e^5 + e^7.5) = 7.57889; image 1 then
    # scores caption 0 at 8 - 9.31326 = -1.31326 and caption 1 at 7.5 - 7.57889 = -0.07889: caption 1 wins
    p = {"gamma1": 10, "gamma2": 10, "lambda1": 10, "lambda2": 10}
    i2t, t2i = rerank(a, "fr", p)
    np.testing.assert_allclose(i2t.numpy(), [[-0.31326, -2.57889], [-1.31326, -0.07889]], atol=1e-4)
    # rows: log(e^9 + e^5) = 9.01815, log(e^8 + e^7.5) = 8.47408
    np.testing.assert_allclose(t2i.numpy(), [[-0.01815, -4.01815], [-0.47408, -0.97408]], atol=1e-4)
    m = evaluate_sims(a, "plain", 1, rerank="fr", rerank_params=p)
    assert m["i2t"]["r1"] == 100.0 and m["t2i"]["r1"] == 100.0 and m["rsum"] == 600.0


def test_fr_matches_eq14_naive():
    s = _matrix()
    g1, g2, l1, l2 = 9.0, 8.0, 8.0, 17.0
    i2t, t2i = _tiny_blocks(s, "fr", {"gamma1": g1, "gamma2": g2, "lambda1": l1, "lambda2": l2})
    n, m = s.shape
    exp_i2t = np.array([[g2 * s[i, j] - _lse([g1 * s[l, j] for l in range(n)]) for j in range(m)] for i in range(n)])
    exp_t2i = np.array([[l2 * s[i, j] - _lse([l1 * s[i, l] for l in range(m)]) for j in range(m)] for i in range(n)])
    np.testing.assert_allclose(i2t.numpy(), exp_i2t, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(t2i.numpy(), exp_t2i, rtol=1e-5, atol=1e-4)


def test_fr_exclude_self_and_max_pool_naive():
    s = _matrix(seed=1)
    s[2, 4] = s[0, 4]  # a tie at a column maximum
    n, m = s.shape
    g1, g2, l1, l2 = 25.0, 20.0, 20.0, 30.0
    p = {"gamma1": g1, "gamma2": g2, "lambda1": l1, "lambda2": l2}
    i2t, t2i = _tiny_blocks(s, "fr", {**p, "exclude_self": True})
    exp_i2t = [[g2 * s[i, j] - _lse([g1 * s[l, j] for l in range(n) if l != i]) for j in range(m)] for i in range(n)]
    exp_t2i = [[l2 * s[i, j] - _lse([l1 * s[i, l] for l in range(m) if l != j]) for j in range(m)] for i in range(n)]
    np.testing.assert_allclose(i2t.numpy(), exp_i2t, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(t2i.numpy(), exp_t2i, rtol=1e-5, atol=1e-4)
    # Eq. 13's bound: γ2·A_ij - γ1·max_{l != i} A_lj
    i2t, t2i = _tiny_blocks(s, "fr", {**p, "pool": "max", "exclude_self": True})
    exp_i2t = [[g2 * s[i, j] - g1 * max(s[l, j] for l in range(n) if l != i) for j in range(m)] for i in range(n)]
    exp_t2i = [[l2 * s[i, j] - l1 * max(s[i, l] for l in range(m) if l != j) for j in range(m)] for i in range(n)]
    np.testing.assert_allclose(i2t.numpy(), exp_i2t, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(t2i.numpy(), exp_t2i, rtol=1e-5, atol=1e-4)
    i2t, _ = rerank(s, "fr", {**p, "pool": "max"})
    exp_i2t = [[g2 * s[i, j] - g1 * max(s[:, j]) for j in range(m)] for i in range(n)]
    np.testing.assert_allclose(i2t.numpy(), exp_i2t, rtol=1e-5, atol=1e-4)


def test_fr_is_stable_for_large_scales():
    s = _matrix(seed=2)
    i2t, t2i = rerank(s, "fr", {"gamma1": 2000, "gamma2": 2000, "lambda1": 2000, "lambda2": 2000})
    assert torch.isfinite(i2t).all() and torch.isfinite(t2i).all()
    # with huge scales the column log-sum-exp is the column maximum: R = γ(A - max_l A_lj)
    np.testing.assert_allclose(i2t.numpy(), 2000 * (s - s.max(0, keepdims=True)), atol=2e-2)


def test_fr_defaults_per_dataset_from_yaml():
    from xmr.config.loader import load_rerank_rows

    rows = load_rerank_rows("fr")[1]  # read at the edge; the re-rankers get plain values
    assert {k: default_params("fr", "cub", rows)[k] for k in ("gamma1", "gamma2", "lambda1", "lambda2")} == \
        {"gamma1": 9.0, "gamma2": 8.0, "lambda1": 8.0, "lambda2": 17.0}
    for ds in ("coco", "f30k", None):
        p = default_params("fr", ds, rows)
        assert (p["gamma1"], p["gamma2"], p["lambda1"], p["lambda2"]) == (25.0, 25.0, 20.0, 20.0)
    # the cub protocol picks the cub row unless told otherwise
    s = _matrix()
    m = evaluate_sims(s, "cub", 3, rerank="fr", image_labels=np.arange(6) % 2, rerank_rows=rows)
    assert m["rerank_params"]["lambda2"] == 17.0
    assert default_params("fr", "cub")["lambda2"] == 20.0  # without rows: the code default


def test_inverted_softmax_and_dual_softmax_naive():
    s = _matrix(seed=3)
    n, m = s.shape
    beta = 7.0
    i2t, t2i = _tiny_blocks(s, "isoftmax", {"beta": beta})
    np.testing.assert_allclose(i2t.numpy(), [[beta * s[i, j] - _lse([beta * s[l, j] for l in range(n)])
                                              for j in range(m)] for i in range(n)], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(t2i.numpy(), [[beta * s[i, j] - _lse([beta * s[i, l] for l in range(m)])
                                              for j in range(m)] for i in range(n)], rtol=1e-5, atol=1e-4)
    tau = 30.0
    i2t, t2i = _tiny_blocks(s, "dsl", {"scale": tau})
    col = [[s[i, j] * math.exp(tau * s[i, j]) / sum(math.exp(tau * s[l, j]) for l in range(n)) for j in range(m)]
           for i in range(n)]
    row = [[s[i, j] * math.exp(tau * s[i, j]) / sum(math.exp(tau * s[i, l]) for l in range(m)) for j in range(m)]
           for i in range(n)]
    np.testing.assert_allclose(i2t.numpy(), col, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(t2i.numpy(), row, rtol=1e-4, atol=1e-6)


def test_csls_naive():
    s = _matrix(seed=4)
    n, m = s.shape
    k = 4
    i2t, t2i = _tiny_blocks(s, "csls", {"k": k})
    r_img = [np.mean(sorted(s[i], reverse=True)[:k]) for i in range(n)]
    r_cap = [np.mean(sorted(s[:, j], reverse=True)[:k]) for j in range(m)]
    exp = [[2 * s[i, j] - r_img[i] - r_cap[j] for j in range(m)] for i in range(n)]
    np.testing.assert_allclose(i2t.numpy(), exp, atol=1e-5)
    np.testing.assert_allclose(t2i.numpy(), exp, atol=1e-5)


def test_qbnorm_naive(tmp_path):
    rng = np.random.default_rng(5)
    s = _matrix(seed=5)
    n, m = s.shape
    bank_i2t = rng.uniform(-0.2, 0.9, size=(4, m)).astype(np.float32)  # 4 bank images x test captions
    bank_t2i = rng.uniform(-0.2, 0.9, size=(n, 7)).astype(np.float32)  # test images x 7 bank captions
    np.save(tmp_path / "bi.npy", bank_i2t)
    beta, k = 10.0, 2
    from xmr.config.loader import load_array_params

    given = {"beta": beta, "k": k, "bank_i2t": str(tmp_path / "bi.npy"), "bank_t2i": bank_t2i}
    with pytest.raises(XmrError, match="pass the array"):  # re-ranking opens no files
        rerank(s, "qbnorm", given)
    i2t, t2i = rerank(s, "qbnorm", load_array_params(given, "qbnorm"))  # the CLI's .npy loading
    active_caps = {j for b in range(4) for j in np.argsort(-bank_i2t[b], kind="stable")[:k]}
    active_imgs = {i for b in range(7) for i in np.argsort(-bank_t2i[:, b], kind="stable")[:k]}
    exp_i2t = np.array(s, dtype=np.float64)
    for i in range(n):
        if int(np.argmax(s[i])) in active_caps:
            exp_i2t[i] = [beta * s[i, j] - _lse([beta * bank_i2t[b, j] for b in range(4)]) for j in range(m)]
    exp_t2i = np.array(s, dtype=np.float64)
    for j in range(m):
        if int(np.argmax(s[:, j])) in active_imgs:
            exp_t2i[:, j] = [beta * s[i, j] - _lse([beta * bank_t2i[i, b] for b in range(7)]) for i in range(n)]
    np.testing.assert_allclose(i2t.numpy(), exp_i2t, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(t2i.numpy(), exp_t2i, rtol=1e-5, atol=1e-4)
    with pytest.raises(XmrError, match="needs a query bank"):
        rerank(s, "qbnorm")
    with pytest.raises(XmrError, match="expected"):
        rerank(s, "qbnorm", {"bank_i2t": bank_t2i, "bank_t2i": bank_t2i})
    # self bank: every query's top-1 is active, so this is the inverted softmax
    torch.testing.assert_close(rerank(s, "qbnorm", {"self_bank": True, "beta": 7.0, "k": 1}),
                               rerank(s, "isoftmax", {"beta": 7.0}))


def _stable_order(values):
    return sorted(range(len(values)), key=lambda j: (-values[j], j))


def _naive_rr_orders(s, k1, k2, groups=None):
    """MTFN-RR's rerank.py semantics, loop by loop (stable orders)."""
    n, m = s.shape
    i2t = []
    for i in range(n):
        order = _stable_order(s[i])
        cand = order[:k1]
        rev = [_stable_order(s[:, j]).index(i) for j in cand]
        i2t.append([cand[p] for p in sorted(range(k1), key=lambda p: rev[p])] + order[k1:])
    t2i = []
    for j in range(m):
        order = _stable_order(s[:, j])
        cand = order[:k2]
        sib = [j] if groups is None else range(j // groups * groups, j // groups * groups + groups)
        rev = [min(_stable_order(s[l]).index(q) for q in sib) for l in cand]
        t2i.append([cand[p] for p in sorted(range(k2), key=lambda p: rev[p])] + order[k2:])
    return i2t, t2i


@pytest.mark.parametrize("groups", [False, True])
def test_rr_orders_match_mtfn_semantics(groups):
    s = _matrix(n=8, c=3, seed=6)
    s[3, :5] = s[3, 5]  # ties inside a candidate list
    params = {"k_i2t": 4, "k_t2i": 3, "t2i_gt_groups": groups}
    i2t, t2i = _tiny_blocks(s, "rr", params, c=3)
    exp_i2t, exp_t2i = _naive_rr_orders(s, 4, 3, 3 if groups else None)
    assert [_stable_order(row) for row in i2t.numpy().tolist()] == exp_i2t
    assert [_stable_order(col) for col in t2i.numpy().T.tolist()] == exp_t2i
    m = evaluate_sims(s, "plain", 3, rerank="rr", rerank_params=params)
    assert m["rerank_params"]["t2i_gt_groups"] is groups
    exp_ranks = [min(exp_t2i[j].index(q) for q in [j // 3]) for j in range(24)]
    assert t2i_ranks(t2i, 3).tolist() == exp_ranks


def test_rr_gt_groups_needs_caption_grouping():
    with pytest.raises(XmrError, match="t2i_gt_groups=true needs"):
        rerank(_matrix(), "rr", {"t2i_gt_groups": True})


def test_mr_matches_galr_formula():
    s = _matrix(n=12, c=2, seed=7) + 0.3  # positive similarities, as MR's linear normalisation assumes
    n, m = s.shape
    k, wp1, wp2, decay = 3, 0.3, 1.1, 0.05
    k1 = max(10, k)
    exp = np.zeros((n, m))
    for i in range(n):
        cand = _stable_order(s[i])[:k1]
        rev = [_stable_order(s[:, j]).index(i) for j in cand]
        q_of = {cand[p]: q for q, p in enumerate(sorted(range(k1), key=lambda p: rev[p]))}
        for p, j in enumerate(cand):
            exp[i, j] = (wp1 * s[i, j] / s[:, j].sum() + math.exp(-decay * (p + 1))
                         + wp2 * math.exp(-decay * (q_of[j] + 1)))
    i2t, t2i = _tiny_blocks(s, "mr", {"k": k, "outside": "zero"})
    np.testing.assert_allclose(i2t.numpy(), exp, rtol=1e-5, atol=1e-6)
    exp_t = np.zeros((n, m))  # t2i: the same on the transposed matrix
    k2 = min(k1, n)
    for j in range(m):
        cand = _stable_order(s[:, j])[:k2]
        rev = [_stable_order(s[l]).index(j) for l in cand]
        q_of = {cand[p]: q for q, p in enumerate(sorted(range(k2), key=lambda p: rev[p]))}
        for p, l in enumerate(cand):
            exp_t[l, j] = (wp1 * s[l, j] / s[l].sum() + math.exp(-decay * (p + 1))
                           + wp2 * math.exp(-decay * (q_of[l] + 1)))
    np.testing.assert_allclose(t2i.numpy(), exp_t, rtol=1e-5, atol=1e-6)
    # outside=keep: the same top K1, then the remaining captions in their similarity order
    keep, _ = rerank(s, "mr", {"k": k})
    for i in range(n):
        order = _stable_order(keep[i].tolist())
        assert order[:k1] == _stable_order(exp[i].tolist())[:k1]
        assert order[k1:] == [j for j in _stable_order(s[i]) if j not in order[:k1]]


@pytest.mark.parametrize("name, params", [("fr", {}), ("rr", {}), ("mr", {}), ("isoftmax", {}), ("dsl", {}),
                                          ("csls", {}), ("qbnorm", {"self_bank": True})])
def test_evaluation_of_lazy_scores_equals_materialized(name, params):
    """The evaluator ranks block by block; it must agree with ranking the materialized re-ranked matrices."""
    s = _matrix(n=20, c=5, seed=8) + 0.3
    i2t, t2i = rerank(s, name, params, captions_per_image=5)
    m = evaluate_sims(s, "plain", 5, rerank=name, rerank_params=params)
    ri, rt = i2t_ranks(i2t, 5), t2i_ranks(t2i, 5)
    assert m["i2t"]["r1"] == pytest.approx(100 * np.mean(ri < 1)) and m["i2t"]["meanr"] == pytest.approx(ri.mean() + 1)
    assert m["t2i"]["r5"] == pytest.approx(100 * np.mean(rt < 5)) and m["t2i"]["meanr"] == pytest.approx(rt.mean() + 1)
    assert m["rerank"] == name


def test_parameter_validation():
    assert RERANKERS.names() == ["csls", "dsl", "dsl_val", "fr", "fr_val", "isoftmax", "isoftmax_val", "mr", "qbnorm",
                                 "rr"]
    with pytest.raises(XmrError, match="unknown parameter 'gamma3' for re-ranker 'fr'"):
        resolve_params("fr", {"gamma3": 1})
    with pytest.raises(XmrError, match="not a valid float"):
        resolve_params("fr", {"gamma1": "abc"})
    with pytest.raises(XmrError, match="not a valid int"):
        resolve_params("rr", {"k_i2t": "2.5"})
    with pytest.raises(XmrError, match="is not one of lse, max"):
        resolve_params("fr", {"pool": "mean"})
    with pytest.raises(XmrError, match="unknown re-ranker"):
        rerank(_matrix(), "fancy")
    p = resolve_params("rr", {"k_i2t": "7", "t2i_gt_groups": "true"})  # CLI strings are converted
    assert p["k_i2t"] == 7 and p["t2i_gt_groups"] is True
    with pytest.raises(XmrError, match="gamma1 must be > 0"):
        rerank(_matrix(), "fr", {"gamma1": 0})


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "index"])
def test_blocks_on_two_threads_give_the_one_thread_numbers_bit_for_bit(ties):
    """On CPU the evaluator's passes run their row blocks on torch's threads (xmr.rerank.map_blocks): FR's
    statistics (column sums combined in block order) and the ranks must be exactly those of one thread."""
    from xmr.evaluation.ranks import grouped_ranks
    from xmr.rerank import map_blocks
    from xmr.rerank.fast import FastRescoring

    s = torch.from_numpy(_matrix(n=40, c=5, seed=3))
    before = torch.get_num_threads()
    got = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert list(map_blocks(lambda b: b * b, range(7))) == [0, 1, 4, 9, 16, 25, 36]  # in order
            for g1, l1 in ((25.0, 20.0), (90.0, 80.0)):  # one shared shift / per-block shifts
                sc = FastRescoring(s, g1, 25.0, l1, 20.0, block_bytes=3 * 4 * 200 * 3)  # blocks of 3 rows
                got[threads, g1] = [sc.col.lse, sc.row.lse, *map(torch.as_tensor, grouped_ranks(sc, 5, ties))]
    finally:
        torch.set_num_threads(before)
    for g1 in (25.0, 90.0):
        for one, two in zip(got[1, g1], got[2, g1]):
            assert torch.equal(one, two)
