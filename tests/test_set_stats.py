"""Set statistics (xmr/evaluation/set_stats.py): correlation of an image's sub-embeddings and slot usage, worked by
hand on tiny tensors; a DVSE run's results file carries them through `xmr score` + `xmr test`."""

import json
import math

import numpy as np
import pytest
import torch

from xmr.evaluation.set_stats import circular_variance, correlation_matrix, mean_off_diagonal, set_statistics, slot_usage
from xmr.settings.run_settings import run_settings


def test_correlation_matrix_by_hand():
    # image 0: orthogonal slots (cos 0); image 1: slots at 45° (cos 1/√2); norms must not matter
    x = torch.tensor([[[2.0, 0.0], [0.0, 3.0]], [[1.0, 0.0], [5.0, 5.0]]])
    m = correlation_matrix(x)
    c = 1 / math.sqrt(2)
    assert m == pytest.approx(np.array([[1.0, c / 2], [c / 2, 1.0]]))
    assert mean_off_diagonal(m) == pytest.approx(c / 2)
    # Pearson centres over D first: (1, 2, 3) and (3, 2, 1) have cosine 10/14 but correlation -1
    y = torch.tensor([[[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]])
    assert mean_off_diagonal(correlation_matrix(y)) == pytest.approx(10 / 14)
    assert mean_off_diagonal(correlation_matrix(y, "pearson")) == pytest.approx(-1.0)
    assert mean_off_diagonal(correlation_matrix(y, "pearson", absolute=True)) == pytest.approx(1.0)
    assert math.isnan(mean_off_diagonal(np.ones((1, 1))))  # K = 1: no pair


def test_circular_variance_by_hand():
    """DivE §4.6: 1 - ||mean of the set's unit vectors||, averaged over sets; norms do not matter."""
    axes = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 0.5]]])  # 3 orthogonal: mean (1/3, 1/3, 1/3)
    assert circular_variance(axes) == pytest.approx(1 - 1 / math.sqrt(3))  # 0.4226
    line = torch.tensor([[[1.0, 0.0, 0.0], [4.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]])  # mean (1/3, 0, 0)
    assert circular_variance(line) == pytest.approx(2 / 3)
    assert circular_variance(torch.cat([axes, line])) == pytest.approx((1 - 1 / math.sqrt(3) + 2 / 3) / 2)
    collapsed = torch.tensor([[[1.0, 1.0], [2.0, 2.0]]])
    assert circular_variance(collapsed) == pytest.approx(0.0, abs=1e-12)
    s = set_statistics(axes)
    assert s["circular_variance"] == pytest.approx(1 - 1 / math.sqrt(3))
    assert s["log_circular_variance"] == pytest.approx(math.log(1 - 1 / math.sqrt(3)))  # DivE's log(Var.)
    assert set_statistics(collapsed)["log_circular_variance"] is None  # log 0: none (JSON has no -inf)


def test_slot_usage_by_hand():
    e1, e2 = [1.0, 0.0], [0.0, 1.0]
    sets = torch.tensor([[e1, e2], [e1, e2]])  # two images, K = 2
    # captions of image 0 lean to slot 0, then slot 1; both captions of image 1 lean to slot 0
    text = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 0.0], [0.9, 0.1]])
    u = slot_usage(sets, text, [0, 0, 1, 1])
    assert u["counts"] == [3, 1] and u["frequency"] == pytest.approx([0.75, 0.25])
    h = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))  # 0.8113 bits
    assert u["entropy_bits"] == pytest.approx(h) and u["entropy_normalised"] == pytest.approx(h / 1.0)
    # a caption set (M, L, D): the slot of the best (k, l) pair; all on slot 1 -> entropy 0
    tset = torch.tensor([[[0.0, 1.0], [0.5, 0.5]], [[0.2, 1.0], [1.0, 1.0]]])
    u = slot_usage(sets, tset, [0, 1])
    assert u["counts"] == [0, 2] and u["entropy_bits"] == 0.0 and u["entropy_normalised"] == 0.0
    # uniform over K = 4 slots: 2 bits, normalised 1
    sets4 = torch.eye(4)[None].repeat(4, 1, 1)
    u = slot_usage(sets4, torch.eye(4), [0, 1, 2, 3])
    assert u["counts"] == [1, 1, 1, 1] and u["entropy_bits"] == pytest.approx(2.0)
    assert u["entropy_normalised"] == pytest.approx(1.0)
    # tied slots (DVSE's gated-off slots are the same vector): the first one wins
    tied = torch.tensor([[e2, e1, e1]])
    assert slot_usage(tied, torch.tensor([[1.0, 0.0]]), [0])["counts"] == [0, 1, 0]


def test_set_statistics_record():
    emb = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
    res = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    s = set_statistics(emb, torch.tensor([[1.0, 0.0]]), [0], res, global_norm=2.5, residual_norm=0.5)
    assert s["k"] == 2 and s["correlation"] == pytest.approx(1 / math.sqrt(2))
    assert s["residual_correlation"] == pytest.approx(0.0)
    assert s["slot_usage"]["counts"] == [1, 0]
    assert s["global_norm"] == 2.5 and s["residual_norm"] == 0.5
    assert json.loads(json.dumps(s)) == s  # a results file stores it as is


def test_dvse_results_file_has_set_statistics(tiny_synth, tmp_path):
    """`xmr train`, `xmr score`, `xmr test` (the demo's chain): the results file carries the set statistics of the
    test split, equal to what the library computes from the model's own sub-embeddings."""
    from tests.conftest import run_xmr
    from xmr.inference.loaders import ImageDataset, collate_images, load_split_with_features
    from xmr.inference.model import encode_split_of, load_trained

    recipe = tiny_synth.recipe("dvse", name="dvse_sets", model={"num_embeds": 3},
                                    text={"word_vectors": None, "word_dim": 16})
    run = tmp_path / "run"
    run_xmr("train", "--config", recipe, "--out-dir", run, "--no-progress", check=True)
    run_xmr("score", "--run", run, "--out", tmp_path / "s.npy", "--no-progress", check=True)
    run_xmr("test", "--run", run, "--sims", tmp_path / "s.npy", "--out", tmp_path / "r.json", "--no-tracking",
            check=True)
    got = json.loads((tmp_path / "r.json").read_text())["set_statistics"]

    model, cfg = load_trained(run)
    data, feats = load_split_with_features(run_settings(cfg).image, cfg["dataset_cfg"], "test")
    img, cap = encode_split_of(model, run_settings(cfg), data, feats, torch.device("cpu"))
    b = collate_images([ImageDataset(feats, list(range(data.num_images)))[i] for i in range(data.num_images)])
    with torch.no_grad():
        feats_, nr = b["feats"], b["num_regions"]  # the method file's base: h_V = GPO(proj(z)), then the PIE-Net
        g = model.image_pool(model.image_proj(feats_), nr)
        out = {**model.image_pie(g, feats_, nr, model.dynamic_mask(feats_, nr)), "global": g}
    assert got["k"] == 3 and got["split"] == "test"
    # DivE's circular variance by loops: 1 - ||mean of the 3 unit sub-embeddings||, averaged over images
    e = torch.nn.functional.normalize(img.double(), dim=-1)
    want_cv = np.mean([1 - float(sum(e[i, a] for a in range(3)).norm() / 3) for i in range(len(e))])
    assert got["circular_variance"] == pytest.approx(want_cv, abs=1e-9)
    assert got["log_circular_variance"] == pytest.approx(math.log(want_cv))
    shown = run_xmr("show", tmp_path / "r.json", "--set-statistics", check=True).stdout.splitlines()
    assert shown[0] == "| target | K | set corr. | circ. var. | log circ. var. | caption circ. var. | residual circ. var. |"
    assert shown[2].startswith(f"| dvse_sets | 3 | {got['correlation']:.3f} | {want_cv:.3f} | {math.log(want_cv):.2f} | — |")
    # DivE Table 5's ablated evaluation through the same command: sub-embedding 1 left out of the similarity
    run_xmr("score", "--run", run, "--out", tmp_path / "s02.npy", "--drop-image-elements", "1", "--no-progress",
            check=True)
    with torch.no_grad():
        want_sims = model.similarity_matrix(img[:, [0, 2]], cap).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "s02.npy"), want_sims, atol=1e-6)
    assert not np.allclose(want_sims, np.load(tmp_path / "s.npy"), atol=1e-4)
    # by loops: each image's 3 x 3 cosines, off-diagonal mean, averaged over images
    e = torch.nn.functional.normalize(img.double(), dim=-1)
    want = np.mean([[float(e[i, a] @ e[i, c]) for a in range(3) for c in range(3) if a != c]
                    for i in range(len(e))])
    assert got["correlation"] == pytest.approx(want, abs=1e-6)
    r = torch.nn.functional.normalize(out["residuals"].double(), dim=-1)
    want_r = np.mean([[float(r[i, a] @ r[i, c]) for a in range(3) for c in range(3) if a != c] for i in range(len(r))])
    assert got["residual_correlation"] == pytest.approx(want_r, abs=1e-6)
    assert got["global_norm"] == pytest.approx(out["global"].norm(dim=-1).mean().item(), rel=1e-5)
    assert got["residual_norm"] == pytest.approx(out["residuals"].norm(dim=-1).mean().item(), rel=1e-5)
    # slot usage over the positive pairs: the slot with the highest cosine with each caption
    # (the first of slots tied within 1e-9: gated-off slots are all LN(h_V(z)))
    winners = []
    for j in range(len(cap)):
        c = (e[data.caption_image[j]] @ torch.nn.functional.normalize(cap[j].double(), dim=0)).tolist()
        winners.append(next(k for k in range(3) if c[k] >= max(c) - 1e-9))
    assert got["slot_usage"]["counts"] == [winners.count(k) for k in range(3)]
