"""The run's cached test gallery (xmr/run/gallery_cache.py): written by `xmr score`, read by
`xmr.load(...).encode_split`, `xmr search` and `xmr test` (the same embeddings and results as recomputing), and stale
when the checkpoint, the feature file or config.yaml changes."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
import torch

import xmr
import xmr.inference.model
from xmr.cli import main
from xmr.run.config import load_run_config
from xmr.data import load_split
from xmr.run.gallery_cache import read_gallery
from xmr.core.io import read_json
from xmr.run.layout import gallery_cache_file
from xmr.core.io import load_checkpoint, save_checkpoint
from xmr.train.trainer import train
from xmr.settings.run_settings import run_settings


@pytest.fixture
def scored(tiny_synth, tmp_path):
    """A one-epoch VSE++ run on its own copy of the features (the test changes them), scored by `xmr score`."""
    features = tmp_path / "features"
    shutil.copytree(tiny_synth.features_dir, features)
    cfg = load_run_config(tiny_synth.recipe("vsepp", name="cache_vsepp", features={"dir": str(features)}))
    run = tmp_path / "run"
    train(cfg, run, progress=False)
    assert not gallery_cache_file(run, "test").exists()
    assert main(["score", "--run", str(run), "--out", str(tmp_path / "sims.npy"), "--device", "cpu",
                 "--no-progress"]) == 0
    return run, features / "synth" / "efficientnet_lite0" / "test.h5"


def _recomputed(run) -> tuple[np.ndarray, np.ndarray]:
    """The test split encoded from scratch, without the cache."""
    model, cfg = xmr.inference.model.load_trained(run, "cpu")
    data, feats = xmr.inference.model.load_split_images(run_settings(cfg).image, cfg["dataset_cfg"], "test")
    img, cap = xmr.inference.model.encode_split_of(model, run_settings(cfg), data, feats, torch.device("cpu"))
    return img.numpy(), cap.numpy()


def _no_split_reads(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the split was read again instead of the cache")

    monkeypatch.setattr(xmr.inference.model, "load_split_images", refuse)


def test_score_writes_the_gallery_and_encode_split_and_search_read_it(scored, monkeypatch, capsys):
    run, _ = scored
    img, cap = _recomputed(run)
    m = xmr.load(run, device="cpu")
    cached = read_gallery(run, m.settings, "test")
    test = load_split(m.cfg["dataset_cfg"], "test")
    assert cached["image_ids"] == list(test.image_ids) and cached["captions"] == list(test.captions)
    assert cached["caption_image"] == [int(i) for i in test.caption_image] and len(cached["captions"]) == 60
    assert cached["image_paths"] == [str(p) for p in test.image_paths]  # what `xmr search` prints beside each id
    np.testing.assert_array_equal(cached["image_emb"], img)
    np.testing.assert_array_equal(cached["text_emb"], cap)

    _no_split_reads(monkeypatch)  # from here on the split cannot be read: everything comes from the cache
    g = m.encode_split()
    np.testing.assert_array_equal(g["image_emb"], img)
    np.testing.assert_array_equal(g["text_emb"], cap)
    assert g["image_ids"] == list(test.image_ids) and g["split"] == "test"
    assert g["image_paths"] == cached["image_paths"]

    capsys.readouterr()
    assert main(["search", "--run", str(run), "--text", "a red circle left of a square", "--k", "3",
                 "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    sims = m.similarity(img, m.encode_text(["a red circle left of a square"]))[:, 0]
    best = np.argsort(-sims, kind="stable")[:3]
    assert [ln.split()[2:] for ln in lines[1:]] == [[test.image_ids[i], str(test.image_paths[i])] for i in best]


def test_xmr_test_reads_the_split_from_the_cache(scored, tmp_path, monkeypatch):
    run, _ = scored
    sims = tmp_path / "sims.npy"
    assert main(["test", "--run", str(run), "--sims", str(sims), "--out", str(tmp_path / "a.json"),
                 "--no-tracking"]) == 0
    gallery_cache_file(run, "test").unlink()  # without the cache: the split read from the dataset
    assert main(["test", "--run", str(run), "--sims", str(sims), "--out", str(tmp_path / "b.json"),
                 "--no-tracking"]) == 0
    a, b = (read_json(tmp_path / f"{n}.json") for n in "ab")
    assert a == b and "ambiguous" in a["subsets"]  # synth's evaluation subset came from the cache too


def _perturb_checkpoint(run) -> None:
    ck = load_checkpoint(run / "best.pt", "cpu")
    ck["model"] = {k: v + 0.01 if v.is_floating_point() else v for k, v in ck["model"].items()}
    save_checkpoint(run / "best.pt", ck)


def _scale_features(h5) -> None:
    with h5py.File(h5, "r+") as f:
        f["features"][...] = f["features"][...] * 2


@pytest.mark.parametrize("change", ["checkpoint", "features", "config"])
def test_a_changed_input_makes_the_cache_stale_and_it_is_recomputed(scored, change):
    run, h5 = scored
    cfg = xmr.load(run, device="cpu").cfg
    before = read_gallery(run, run_settings(cfg), "test")
    if change == "checkpoint":
        _perturb_checkpoint(run)
    elif change == "features":
        _scale_features(h5)
    else:
        with open(run / "config.yaml", "a") as f:
            f.write("# edited\n")
    assert read_gallery(run, run_settings(cfg), "test") is None
    img, cap = _recomputed(run)
    g = xmr.load(run, device="cpu").encode_split()  # recomputed, and cached again
    np.testing.assert_array_equal(g["image_emb"], img)
    np.testing.assert_array_equal(g["text_emb"], cap)
    again = read_gallery(run, run_settings(cfg), "test")
    np.testing.assert_array_equal(again["image_emb"], img)
    if change != "config":  # the embeddings themselves moved
        assert not np.allclose(img, before["image_emb"])


def test_a_trained_model_is_loaded_without_reading_word_vectors(scored, monkeypatch):
    """The checkpoint's word embeddings replace GloVe's: loading reads no vectors and encodes as the trained model."""
    import xmr.text.word_vectors

    run, _ = scored
    cfg = xmr.load(run, device="cpu").cfg
    assert cfg["text"]["word_vectors"] == "glove6b50d"
    ck = load_checkpoint(run / "best.pt", "cpu")
    # reads GloVe, as training
    with_vectors = xmr.inference.model.model_from_config(cfg, ck["image_dim"], ck["vocab_words"])
    with_vectors.load_state_dict(ck["model"])

    def refuse(*a, **k):
        raise AssertionError("word vectors read while loading a trained model")

    monkeypatch.setattr(xmr.text.word_vectors, "load_word_vectors", refuse)
    m = xmr.load(run, device="cpu")
    text = ["a red circle left of a square", "a blue triangle"]
    expected = xmr.inference.model.Model(with_vectors, cfg, torch.device("cpu")).encode_text(text)
    np.testing.assert_array_equal(m.encode_text(text), expected)


def test_a_features_only_split_has_no_image_files_and_search_prints_ids(scored, monkeypatch, capsys):
    """A dataset that lists no image files (SCAN's precomputed features): the gallery has ``image_paths`` None and
    `xmr search` prints each result's id alone."""
    import dataclasses

    from xmr.run.gallery_cache import write_gallery

    run, _ = scored
    m = xmr.load(run, device="cpu")
    img, cap = _recomputed(run)
    features_only = dataclasses.replace(load_split(m.cfg["dataset_cfg"], "test"), image_paths=[])
    assert write_gallery(run, m.settings, "test", features_only, img, cap) is not None
    _no_split_reads(monkeypatch)
    assert m.encode_split()["image_paths"] is None
    capsys.readouterr()
    assert main(["search", "--run", str(run), "--text", "a red circle", "--k", "2", "--device", "cpu"]) == 0
    results = capsys.readouterr().out.splitlines()[1:]
    assert len(results) == 2 and all(len(r.split()) == 3 for r in results)  # rank, score, id
