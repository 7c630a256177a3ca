"""The public inference API (xmr.load) against `xmr score` on the same tiny runs, and `xmr search`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import xmr
from xmr.cli import main
from xmr.run.config import load_run_config
from xmr.data import load_split
from xmr.train.trainer import train


@pytest.fixture(scope="module")
def runs(tiny_synth, module_tmp):
    """A vector method (VSE++) and a set-based one (PVSE: max-of-set similarity), one epoch each."""
    root = module_tmp("inference_runs")
    out = {}
    for method in ("vsepp", "pvse"):
        cfg = load_run_config(tiny_synth.recipe(method, name=f"api_{method}"))
        train(cfg, root / method, progress=False)
        out[method] = root / method
    return out


def _score_cli(run, tmp_path) -> np.ndarray:
    out = tmp_path / "sims.npy"
    assert main(["score", "--run", str(run), "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    return np.load(out)


@pytest.mark.parametrize("method", ["vsepp", "pvse"])
def test_encode_then_similarity_equals_xmr_score(runs, tiny_synth, tmp_path, method):
    expected = _score_cli(runs[method], tmp_path)
    m = xmr.load(runs[method], device="cpu")
    assert not m.model.training and m.method == method
    assert not any(isinstance(v, torch.optim.Optimizer) for v in vars(m).values())
    test = load_split(m.cfg["dataset_cfg"], "test")
    h5 = tiny_synth.features_dir / "synth" / "efficientnet_lite0" / "test.h5"
    img = m.encode_image(features=h5)  # every row of the precomputed test features
    txt = m.encode_text(test.captions)  # free text, tokenised as the dataset reader does
    if method == "pvse":
        assert img.ndim == 3 and txt.ndim == 3  # sets of embeddings: the method's own set similarity applies
    sims = m.similarity(img, txt)
    assert sims.shape == expected.shape == (12, 60)
    np.testing.assert_allclose(sims, expected, rtol=0, atol=1e-5)


def test_encode_image_inputs_agree(runs, tiny_synth, capfd, monkeypatch):
    """Rows of the feature file, the same features as an array, and the image files through the backbone."""
    from efficientnet_lite_pytorch import EfficientNet

    from xmr.features.store import FeatureFile

    builds = []
    load_weights = EfficientNet.from_pretrained
    monkeypatch.setattr(EfficientNet, "from_pretrained", lambda *a, **kw: builds.append(a) or load_weights(*a, **kw))

    m = xmr.load(runs["vsepp"] / "best.pt", device="cpu")  # a checkpoint path works as well as the run dir
    assert repr(m) == (f"Model(method='vsepp', name='api_vsepp', dataset='synth', embed_dim=32, device='cpu', "
                       f"from='{runs['vsepp']}')")  # the tiny recipes' embedding size (conftest.py)
    h5 = tiny_synth.features_dir / "synth" / "efficientnet_lite0" / "test.h5"
    ff = FeatureFile(h5)
    rows = [3, 0, 7]
    from_rows = m.encode_image(features=h5, rows=rows)
    arr = np.stack([np.asarray(ff[i], dtype=np.float32) for i in rows])
    from_array = m.encode_image(arr, num_regions=ff.num_regions[rows])
    np.testing.assert_allclose(from_array, from_rows, rtol=0, atol=1e-6)
    test = load_split(m.cfg["dataset_cfg"], "test")
    capfd.readouterr()
    from_files = m.encode_image([test.image_paths[i] for i in rows])  # extracted as `xmr extract` does
    np.testing.assert_allclose(from_files, from_rows, rtol=0, atol=1e-4)
    # a second query reuses the backbone the first one built (its weights are loaded once) and gives the same bits
    np.testing.assert_array_equal(m.encode_image([test.image_paths[i] for i in rows]), from_files)
    assert builds == [("efficientnet-lite0",)]  # the weights were loaded once
    assert m._backbone.folded_for_extraction  # and the folded copy is what it keeps (not refolded per query)
    printed = capfd.readouterr()
    assert printed.out == ""  # nor the package's "Loaded pretrained weights" line on stdout
    assert "extract" not in printed.err  # a library call writes no extraction log line


def test_search_ranks_by_similarity(runs):
    m = xmr.load(runs["vsepp"], device="cpu")
    g = m.encode_split()
    queries = ["a red circle left of a square", "a blue triangle"]
    idx, scores = m.search(queries, g["image_emb"], k=4)
    sims = m.similarity(g["image_emb"], m.encode_text(queries))  # images x queries
    for q in range(2):
        order = np.argsort(-sims[:, q], kind="stable")[:4]
        np.testing.assert_array_equal(idx[q], order)
        np.testing.assert_allclose(scores[q], sims[order, q], atol=1e-6)
    # re-ranked with CSLS (k = 10): 2 A[i, j] - mean top-k of image i's row - mean top-k of query j's column
    idx_r, scores_r = m.search(queries, g["image_emb"], k=4, rerank="csls")
    a = sims.astype(np.float64)
    r_img = np.sort(a, axis=1)[:, ::-1][:, :min(10, a.shape[1])].mean(1)
    r_cap = np.sort(a, axis=0)[::-1][:min(10, a.shape[0])].mean(0)
    csls = 2 * a - r_img[:, None] - r_cap[None, :]
    for q in range(2):
        np.testing.assert_allclose(scores_r[q], np.sort(csls[:, q])[::-1][:4], atol=1e-5)
    # image queries over the captions: the row of the same matrix
    img_idx, img_scores = m.search(g["image_emb"][:1], g["text_emb"], k=3, queries_are="image")
    row = m.similarity(g["image_emb"][:1], g["text_emb"])[0]
    np.testing.assert_array_equal(img_idx[0], np.argsort(-row, kind="stable")[:3])


def test_search_cli_prints_k_results(runs, capsys):
    assert main(["search", "--run", str(runs["vsepp"]), "--text", "a red circle left of a square", "--k", "5",
                 "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("query: a red circle left of a square")
    results = lines[1:]
    assert len(results) == 5 and [int(r.split()[0]) for r in results] == [1, 2, 3, 4, 5]
    scores = [float(r.split()[1]) for r in results]
    assert scores == sorted(scores, reverse=True)
    m = xmr.load(runs["vsepp"], device="cpu")
    g = m.encode_split()
    best = m.similarity(g["image_emb"], m.encode_text(["a red circle left of a square"]))[:, 0].max()
    assert abs(scores[0] - best) < 1e-4  # printed with 4 decimals
    # each image's id, then its file (what a user opens), as the split lists them
    split = load_split(m.cfg["dataset_cfg"], "test")
    file_of = dict(zip(split.image_ids, map(str, split.image_paths)))
    for r in results:
        _, _, image_id, path = r.split()
        assert path == file_of[image_id] and Path(path).is_file()
    assert g["image_paths"] == [file_of[i] for i in g["image_ids"]]  # the gallery API carries them too


def test_search_cli_image_query(runs, capsys):
    m = xmr.load(runs["vsepp"], device="cpu")
    path = load_split(m.cfg["dataset_cfg"], "test").image_paths[0]
    assert main(["search", "--run", str(runs["vsepp"]), "--image", str(path), "--k", "3", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()  # ours alone: not the backbone package's load line
    assert len(lines) == 4 and lines[0].startswith(f"query: {path}")
    assert [int(r.split()[0]) for r in lines[1:]] == [1, 2, 3]


def test_load_bad_run_is_one_line(tmp_path, capsys):
    assert main(["search", "--run", str(tmp_path / "nope"), "--text", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such run directory or checkpoint" in err[0]


def test_readme_example_matches_xmr_score(runs, tmp_path, capsys):
    """The README's Inference API block, run as written on a tiny run instead of the demo's runs/synth/dvse_demo."""
    import re

    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("**The Python API**"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'xmr.load("runs/synth/dvse_demo")' in code
    ns: dict = {}
    exec(code.replace("runs/synth/dvse_demo", str(runs["vsepp"])), ns)  # noqa: S102 - our own README
    printed = capsys.readouterr().out
    assert printed.count("'") >= 10  # five image ids were printed
    np.testing.assert_allclose(ns["sims"], _score_cli(runs["vsepp"], tmp_path), rtol=0, atol=1e-5)


def test_end_to_end_run_encodes_image_files_through_its_own_backbone(tiny_synth, tmp_path):
    """features.source: images: the fine-tuned backbone is in the checkpoint; files -> embeddings as `xmr score`."""
    cfg = load_run_config(tiny_synth.recipe("vse_inf", name="api_e2e", features={"source": "images"},
                                            image_backbone={}))
    train(cfg, tmp_path / "run", progress=False)
    expected = _score_cli(tmp_path / "run", tmp_path)
    m = xmr.load(tmp_path / "run", device="cpu")
    assert m.model.image_backbone is not None and not m.model.image_backbone.training
    test = load_split(m.cfg["dataset_cfg"], "test")
    sims = m.similarity(m.encode_image(test.image_paths), m.encode_text(test.captions))
    np.testing.assert_allclose(sims, expected, rtol=0, atol=1e-5)


def _float32_array(x, shape: tuple[int, ...]) -> None:
    assert type(x) is np.ndarray, type(x)  # not a torch.Tensor, not an ndarray subclass
    assert x.dtype == np.float32 and x.shape == shape, (x.dtype, x.shape)


def test_numpy_out_numpy_or_torch_in(tiny_synth_run, tiny_synth):
    """docs/inference.md "Array types": every public method returns float32 NumPy arrays of the documented shapes
    and takes NumPy arrays or torch tensors; written as the README's snippet is (the tiny DVSE run: 12 test images,
    5 captions each, K sub-embeddings per image, one embedding per caption)."""
    from xmr.features.store import FeatureFile
    from xmr.run.layout import gallery_cache_file

    m = xmr.load(tiny_synth_run, device="cpu")
    d, k = m.cfg["model"]["embed_dim"], m.cfg["model"]["num_embeds"]
    assert (d, k) == (32, 6)  # the tiny recipe's embed_dim, DVSE's default K: a set method, (B, K, D) images
    test = load_split(m.cfg["dataset_cfg"], "test")
    h5 = tiny_synth.features_dir / "synth" / "efficientnet_lite0" / "test.h5"

    txt = m.encode_text(["a red circle left of a square", "a blue triangle", "a green square"])
    _float32_array(txt, (3, d))
    rows = [3, 0, 7]
    from_files = m.encode_image([test.image_paths[i] for i in rows])
    _float32_array(from_files, (3, k, d))
    from_rows = m.encode_image(features=h5, rows=rows)
    _float32_array(from_rows, (3, k, d))
    ff = FeatureFile(h5)
    feats = np.stack([np.asarray(ff[i], dtype=np.float32) for i in rows])
    from_array = m.encode_image(feats, num_regions=ff.num_regions[rows])
    _float32_array(from_array, (3, k, d))
    from_tensor = m.encode_image(torch.from_numpy(feats), num_regions=torch.as_tensor(ff.num_regions[rows]))
    _float32_array(from_tensor, (3, k, d))
    np.testing.assert_array_equal(from_tensor, from_array)  # the same computation whatever the input type

    gallery_cache_file(tiny_synth_run, "test").unlink(missing_ok=True)
    for source in ("computed", "cached"):  # the first call encodes the split and caches it, the second reads it
        g = m.encode_split("test")
        _float32_array(g["image_emb"], (12, k, d))
        _float32_array(g["text_emb"], (60, d))
        assert gallery_cache_file(tiny_synth_run, "test").is_file(), source
        if source == "computed":
            computed = g
    np.testing.assert_array_equal(g["image_emb"], computed["image_emb"])
    np.testing.assert_array_equal(g["text_emb"], computed["text_emb"])

    sims = m.similarity(g["image_emb"], g["text_emb"])
    _float32_array(sims, (12, 60))
    np.testing.assert_array_equal(m.similarity(torch.from_numpy(g["image_emb"]), torch.from_numpy(g["text_emb"])),
                                  sims)
    # text queries (-> images), as strings and as embeddings (NumPy or torch): (Q, k) int64 indices, float32 scores
    idx, scores = m.search(["a red circle left of a square", "a blue triangle"], g["image_emb"], k=5)
    assert type(idx) is np.ndarray and idx.dtype == np.int64 and idx.shape == (2, 5)
    _float32_array(scores, (2, 5))
    # (another batch shape may round the last bit differently: 1e-6)
    np.testing.assert_allclose(scores, np.take_along_axis(m.similarity(g["image_emb"], txt[:2]).T, idx, 1),
                               rtol=0, atol=1e-6)
    by_array = m.search(g["text_emb"][:4], g["image_emb"], k=5, queries_are="text")
    by_tensor = m.search(torch.from_numpy(g["text_emb"][:4]), torch.from_numpy(g["image_emb"]), k=5,
                         queries_are="text")
    _float32_array(by_array[1], (4, 5))
    np.testing.assert_array_equal(by_tensor[0], by_array[0])
    np.testing.assert_array_equal(by_tensor[1], by_array[1])
    np.testing.assert_allclose(by_array[1], np.sort(sims[:, :4].T, axis=1)[:, ::-1][:, :5], rtol=0, atol=1e-6)
    # image queries (-> captions)
    idx, scores = m.search(g["image_emb"][:2], g["text_emb"], k=5, queries_are="image")
    assert idx.dtype == np.int64 and idx.shape == (2, 5)
    _float32_array(scores, (2, 5))
    np.testing.assert_allclose(scores, np.sort(sims[:2], axis=1)[:, ::-1][:, :5], rtol=0, atol=1e-6)
