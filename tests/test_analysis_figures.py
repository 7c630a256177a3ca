"""`xmr figure` (xmr/report/analysis_figures.py, xmr/report/figures.py) on tiny trained runs: DivE's slot maps with
each element's nearest caption (its slot attention exposed), regions ranked by cosine, t-SNE, two runs side by side,
a history column over training (ADOPT's K); and DivE's element-ablated scoring through `xmr score`. Numbers are
worked out by hand where the figure computes one."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from xmr.report.analysis_figures import disagreeing_queries
from xmr.report.figures import nearest_captions, rank_scores

from conftest import xmr_in_process

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def fig_runs(tiny_synth, module_tmp):
    """A tiny DivE (K = 2, one block) and a tiny VSE+2AD with ADOPT's K held at 3, each scored on the test split."""
    root = module_tmp("figure_runs")
    recipes = {
        "dive": tiny_synth.recipe("dive", name="dive_fig", text={"word_vectors": None, "word_dim": 16},
                                  model={"num_embeds": 2, "iterations": 1, "heads": 2, "dim_head": 8}),
        "vse_2ad": tiny_synth.recipe("vse_2ad", name="v2ad_fig", text={"word_vectors": None, "word_dim": 16},
                                     loss={"k_mode": "constant", "const_k": 3}, train={"epochs": 2}),
    }
    runs = {}
    for name, recipe in recipes.items():
        run = root / name
        for args in (("train", "--config", recipe, "--out-dir", run, "--no-progress"),
                     ("score", "--run", run, "--out", run / "test_sims.npy", "--no-progress")):
            r = xmr_in_process(*args)
            assert r.returncode == 0, r.stderr
        runs[name] = run
    return runs


def test_nearest_caption_of_each_set_element_by_hand():
    elements = np.array([[1.0, 0.0], [0.0, 2.0]])  # K = 2
    single = np.array([[0.6, 0.8], [1.0, 0.1], [-1.0, 0.0]])  # cosines with e1: 0.6, 0.995, -1; with e2: 0.8, 0.0995, 0
    assert nearest_captions(elements, single) == [1, 0]
    sets = np.array([[[0.0, -1.0], [0.1, 1.0]], [[1.0, 0.0], [0.0, -1.0]]])  # caption sets: the best element counts
    assert nearest_captions(elements, sets) == [1, 0]


def test_dvse_fig10_region_scores_by_hand():
    # R = 4 regions; ranks (1 = most similar) 2, 4, 1, 3 -> (R - r)² = 4, 0, 9, 1
    sims = np.array([[0.5, -0.2, 0.9, 0.1], [0.0, 0.3, 0.2, 0.1]])
    assert rank_scores(sims).tolist() == [[4.0, 0.0, 9.0, 1.0], [0.0, 9.0, 4.0, 1.0]]


def test_dive_slot_maps_with_nearest_captions_and_region_ranking(fig_runs, tmp_path):
    from xmr.inference.loaders import load_split_with_features
    from xmr.inference.model import load_trained
    from xmr.report.figures import image_attention
    from xmr.settings.run_settings import run_settings

    run = fig_runs["dive"]
    r = xmr_in_process("figure", "maps", "--run", run, "--captions", "--images", "1", "--machine", "test box",
                       "--out", tmp_path / "slots.png")
    assert r.returncode == 0, r.stderr
    assert "attention of 2 sub-embeddings" in r.stdout and (tmp_path / "slots.png").read_bytes()[:8] == PNG
    # DivE's slot attention (once `attention_figure` raised for DivE): the last block's Â, a distribution over the
    # regions for each slot
    model, cfg = load_trained(run)
    data, feats = load_split_with_features(run_settings(cfg).image, cfg["dataset_cfg"], "test")
    n = int(feats.num_regions[0])
    attn, mask = image_attention(model, torch.from_numpy(np.asarray(feats[0][:n]))[None], torch.tensor([n]))
    assert attn.shape == (1, 2, n) and np.allclose(attn.sum(-1), 1.0, atol=1e-5) and mask is None
    r = xmr_in_process("figure", "maps", "--run", run, "--weights", "similarity", "--images", "1",
                       "--out", tmp_path / "regions.png")
    assert r.returncode == 0, r.stderr
    assert "similarity of 2 sub-embeddings" in r.stdout and (tmp_path / "regions.png").read_bytes()[:8] == PNG


def test_maps_of_a_single_vector_run_fail_in_one_line(fig_runs, tmp_path):
    for weights, message in (("attention", "exposes no per-sub-embedding attention"),
                             ("similarity", "image sub-embeddings to compare them with")):
        r = xmr_in_process("figure", "maps", "--run", fig_runs["vse_2ad"], "--weights", weights,
                           "--out", tmp_path / "m.png")
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "m.png").exists()


def test_tsne_has_every_set_element_of_both_modalities(fig_runs, tmp_path):
    r = xmr_in_process("figure", "tsne", "--run", fig_runs["dive"], fig_runs["vse_2ad"], "--images", "6",
                       "--out", tmp_path / "tsne.png")
    assert r.returncode == 0, r.stderr
    # DivE: 6 images x K = 2 + 6 captions x L = 2 = 24 points; VSE+2AD: 6 + 6 single vectors
    assert f"{fig_runs['dive']} 24 points, 2 slot(s)" in r.stdout
    assert f"{fig_runs['vse_2ad']} 12 points, 1 slot(s)" in r.stdout
    assert (tmp_path / "tsne.png").read_bytes()[:8] == PNG
    # CODER Fig. 3's reading: one element of each set (0), every caption of the images (tiny synth: 5 per image)
    r = xmr_in_process("figure", "tsne", "--run", fig_runs["dive"], "--images", "4", "--element", "0",
                       "--all-captions", "--out", tmp_path / "tsne1.png")
    assert r.returncode == 0, r.stderr
    assert f"{fig_runs['dive']} 24 points, 1 slot(s)" in r.stdout  # 4 images + 4 x 5 captions, one element each


def test_disagreeing_queries_by_hand():
    a = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.4]])
    b = np.array([[0.1, 0.9], [0.3, 0.7], [0.6, 0.2]])  # row 0 differs, rows 1 and 2 agree
    assert disagreeing_queries(a, b, 1, seed=0) == [0]
    assert len(disagreeing_queries(a, b, 2, seed=0)) == 2 and 0 in disagreeing_queries(a, b, 2, seed=0)


def test_two_runs_side_by_side_name_each_runs_rank_of_the_ground_truth(fig_runs, tmp_path):
    from xmr.data import load_split
    from xmr.run.config import load_saved_config

    runs = [fig_runs["dive"], fig_runs["vse_2ad"]]
    sims = [run / "test_sims.npy" for run in runs]
    r = xmr_in_process("figure", "compare", "--run", *runs, "--sims", *sims, "--queries", "2",
                       "--out", tmp_path / "compare.png")
    assert r.returncode == 0, r.stderr
    caps = eval(r.stdout.split("query captions ")[1].split(", ground-truth")[0])  # noqa: S307 (a printed list)
    ranks = eval(r.stdout.split("(A, B) ")[1])  # noqa: S307
    cfg = load_saved_config(runs[0])
    owner = np.asarray(load_split(cfg["dataset_cfg"], "test").caption_image)
    for j, pair in zip(caps, ranks):  # rank of the ground truth = 1 + images scored strictly higher (no ties here)
        want = [1 + int((np.load(s)[:, j] > np.load(s)[owner[j], j]).sum()) for s in sims]
        assert pair == want
    # image to text (DVSE Fig. 12): rank of the image's best-scored own caption
    r = xmr_in_process("figure", "compare", "--run", *runs, "--sims", *sims, "--direction", "i2t", "--queries", "2",
                       "--top-k", "5", "--out", tmp_path / "compare_i2t.png")
    assert r.returncode == 0, r.stderr
    images = eval(r.stdout.split("query images ")[1].split(", ground-truth")[0])  # noqa: S307
    ranks = eval(r.stdout.split("(A, B) ")[1])  # noqa: S307
    for i, pair in zip(images, ranks):
        want = [1 + int((np.load(s)[i] > np.load(s)[i][owner == i].max()).sum()) for s in sims]
        assert pair == want
    r = xmr_in_process("figure", "compare", "--run", *runs, "--sims", sims[0], tmp_path / "nope.npy",
                       "--out", tmp_path / "x.png")
    assert r.returncode == 2 and "nope.npy" in r.stderr


def test_adopt_k_over_training_is_a_history_column(fig_runs, tmp_path):
    run = fig_runs["vse_2ad"]
    with open(run / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(row["train_k"]) for row in rows] == [3.0, 3.0]  # k_mode constant, const_k 3, full batches
    r = xmr_in_process("figure", "curves", "--run", run, "--column", "train_k", "--labels", "ADOPT",
                       "--out", tmp_path / "k.png")
    assert r.returncode == 0, r.stderr
    assert "train_k of ADOPT (2 epochs)" in r.stdout and (tmp_path / "k.png").read_bytes()[:8] == PNG
    r = xmr_in_process("figure", "curves", "--run", run, "--column", "nosuch", "--out", tmp_path / "x.png")
    assert r.returncode == 2 and "history.csv has no 'nosuch' column (it has: epoch," in r.stderr


def test_dive_scored_with_one_caption_element(fig_runs, tmp_path):
    """DivE Table 5 (right) through `xmr score`: only S^T(1) of each caption set."""
    from xmr.inference.loaders import load_split_with_features
    from xmr.inference.model import encode_split_of, load_trained
    from xmr.settings.run_settings import run_settings

    run = fig_runs["dive"]
    r = xmr_in_process("score", "--run", run, "--caption-elements", "0", "--out", tmp_path / "s.npy", "--no-progress")
    assert r.returncode == 0, r.stderr
    model, cfg = load_trained(run)
    data, feats = load_split_with_features(run_settings(cfg).image, cfg["dataset_cfg"], "test")
    img, cap = encode_split_of(model, run_settings(cfg), data, feats, torch.device("cpu"))
    # smooth-Chamfer of a K-set against a one-element set, by its formula (DivE Eq. 6-7, α = 16)
    e = torch.nn.functional.normalize(img.double(), dim=-1)
    t = torch.nn.functional.normalize(cap[:, 0].double(), dim=-1)
    c = torch.einsum("nkd,md->nkm", e, t)
    alpha, k = 16.0, img.shape[1]
    want = c.sum(1) / (2 * k) + torch.logsumexp(alpha * c, dim=1) / (2 * alpha)
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), want.numpy(), atol=1e-5)
