"""VSE++ (fartashf/vsepp) imported from its released container equals the reference code.

The fixture (tests/fixtures/checkpoints/vsepp/, made by make_vsepp.py from the reference's own model code; README.md
there) is a pre-zip, pickle-protocol-2 torch file with an ``argparse.Namespace`` inside, a pickled ``Vocabulary``,
the inputs and what the reference computed: image and caption embeddings (one-directional GRU read at the last
token) and the similarity matrix. xmr must give the same within 1e-5 (float32).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from xmr.checkpoints.importer import import_checkpoint
from xmr.core.errors import XmrError
from xmr.inference.model import load_trained

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "checkpoints" / "vsepp"
TOL = 1e-5


@pytest.fixture(scope="module")
def run_dir(module_tmp):
    out = module_tmp("runs") / "coco" / "vsepp_official_precomp"
    import_checkpoint(out, "vsepp", FIX / "model_best.pth.tar", FIX / "coco_precomp_vocab.pkl", dataset="coco",
                      config_dir=REPO / "config")
    return out


def test_the_fixture_is_a_pre_zip_protocol_2_pickle_with_byte_strings():
    data = (FIX / "model_best.pth.tar").read_bytes()
    assert data[:2] == b"\x80\x02"  # legacy (torch < 1.6) serialization, pickle protocol 2, not a zip archive
    assert b"U\x09fc.weight" in data and b"X\x09\x00\x00\x00fc.weight" not in data  # Python 2 str, not unicode


def test_python2_byte_strings_that_are_not_utf8_are_read_as_latin1(tmp_path):
    """A Python 2 file whose option strings hold latin-1 bytes (a path with an accent): the first read (UTF-8)
    fails, the latin-1 retry gives the text."""
    import argparse
    import sys

    from xmr.checkpoints.base import load_official

    sys.path.insert(0, str(FIX.parent))
    import py2pickle

    src = tmp_path / "model_best.pth.tar"
    ck = {"model": [{"fc.weight": torch.ones(2, 3)}, {}], "opt": argparse.Namespace(logger_name="runs/caf\xe9")}
    torch.save(ck, src, pickle_module=py2pickle, pickle_protocol=2, _use_new_zipfile_serialization=False)
    got = load_official(src, [argparse.Namespace])
    assert got["opt"].logger_name == "runs/caf\xe9" and torch.equal(got["model"][0]["fc.weight"], torch.ones(2, 3))


def test_embeddings_and_similarities_equal_the_reference(run_dir):
    model, cfg = load_trained(run_dir)
    assert cfg["text"]["bigru_directions"] == "forward" and cfg["model"]["text_pool"] == "last"
    feats = torch.from_numpy(np.load(FIX / "images.npy"))[:, None, :]  # one precomputed vector per image
    captions = json.loads((FIX / "inputs.json").read_text())["captions"]
    with torch.no_grad():
        img = model.encode_image(feats, torch.ones(len(feats), dtype=torch.long))
        cap = model.encode_text(model.text.collate(captions, [[] for _ in captions]))
        sims = model.similarity_matrix(img, cap)
    np.testing.assert_allclose(img.numpy(), np.load(FIX / "expected_img_emb.npy"), atol=TOL, rtol=0)
    np.testing.assert_allclose(cap.numpy(), np.load(FIX / "expected_cap_emb.npy"), atol=TOL, rtol=0)
    np.testing.assert_allclose(sims.numpy(), np.load(FIX / "expected_sims.npy"), atol=TOL, rtol=0)


def test_vocabulary_pickle_runs_no_code(tmp_path):
    """A pickle naming any class but the Vocabulary is refused, not run."""
    bad = tmp_path / "coco_precomp_vocab.pkl"
    bad.write_bytes(pickle.dumps(print, protocol=2))
    with pytest.raises(XmrError, match=r"refuses to load __builtin__.print"):
        import_checkpoint(tmp_path / "run", "vsepp", FIX / "model_best.pth.tar", bad, dataset="coco",
                          config_dir=REPO / "config")
    assert not (tmp_path / "run").exists()


def test_the_file_names_its_precomputed_features(run_dir):
    """opt.data_name coco_precomp, cnn_type vgg19 and a 4096-d image layer: VSE++'s released VGG19 vectors."""
    _, cfg = load_trained(run_dir)
    assert cfg["features"]["backbone"] == "vsepp_vgg19_precomp" and cfg["features"]["source"] == "precomputed"
    assert cfg["backbone_cfg"]["feature_dim"] == 4096 and "import-features" in cfg["backbone_cfg"]["import_command"]


def test_features_must_be_named_where_the_file_does_not_say(tmp_path):
    """A file whose opt names no *_precomp data: the error names the flag that settles it."""
    import argparse

    from xmr.checkpoints.base import load_official

    ck = load_official(FIX / "model_best.pth.tar", [argparse.Namespace])
    del ck["opt"].data_name
    src = tmp_path / "model_best.pth.tar"
    torch.save(ck, src)
    with pytest.raises(XmrError, match="features.backbone=KEY"):
        import_checkpoint(tmp_path / "run", "vsepp", src, FIX / "coco_precomp_vocab.pkl",
                          dataset="coco", config_dir=REPO / "config")
    assert not (tmp_path / "run").exists()
