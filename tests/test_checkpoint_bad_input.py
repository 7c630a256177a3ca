"""Malformed official checkpoints: one line naming the file and what to do, exit 2, no run directory left."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from xmr.cli import main

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "checkpoints" / "vse_infty"


@pytest.fixture(autouse=True)
def _repo_config(monkeypatch):
    monkeypatch.chdir(REPO)  # config/ of the repository; outputs go to tmp_path


def _official() -> dict:
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(FIX / "model_best.pth", weights_only=True)


def _import(tmp_path: Path, src: Path, capsys, vocab: Path | None = FIX / "coco_precomp_vocab.json",
            fmt: str = "vse_infty", extra: tuple[str, ...] = ()) -> str:
    out = tmp_path / "runs" / "coco" / "imported"
    rc = main(["import-checkpoint", "--format", fmt, "--src", str(src),
               *(["--vocab", str(vocab)] if vocab is not None else []), "--dataset", "coco", "--out", str(out),
               *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert not out.exists() and (not out.parent.exists() or os.listdir(out.parent) == [])  # nor a temporary
    return err


def test_truncated_file(tmp_path, capsys):
    src = tmp_path / "model_best.pth"
    data = (FIX / "model_best.pth").read_bytes()
    src.write_bytes(data[: len(data) // 2])
    err = _import(tmp_path, src, capsys)
    assert f"{src}: not a readable checkpoint" in err and "check the file is complete" in err


def test_not_a_checkpoint(tmp_path, capsys):
    src = tmp_path / "notes.pth"
    src.write_text("these are not weights\n")
    err = _import(tmp_path, src, capsys)
    assert f"{src}: not a readable checkpoint" in err


def test_wrong_format_a_bare_state_dict(tmp_path, capsys):
    """A PVSE-style file (a bare state dict) given as --format vse_infty."""
    src = tmp_path / "pvse.pth"
    torch.save({"module.img_enc.fc.weight": torch.zeros(2, 2)}, src)
    err = _import(tmp_path, src, capsys)
    assert f"{src}: not a VSE++/VSE∞ checkpoint" in err and "--format" in err


def test_unknown_format_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["import-checkpoint", "--format", "clip", "--src", str(FIX / "model_best.pth"), "--dataset", "coco",
              "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "invalid choice: 'clip'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_vocabulary_size_disagrees_with_the_embedding(tmp_path, capsys):
    doc = json.loads((FIX / "coco_precomp_vocab.json").read_text())
    last = max(doc["word2idx"], key=doc["word2idx"].get)
    del doc["word2idx"][last]
    vocab = tmp_path / "f30k_precomp_vocab.json"
    vocab.write_text(json.dumps(doc))
    err = _import(tmp_path, FIX / "model_best.pth", capsys, vocab=vocab)
    assert err.startswith(f"xmr import-checkpoint: error: {vocab}: 34 words (with <mask>) but ")
    assert "35-row word embedding; pass the vocabulary the model was trained with" in err


@pytest.mark.parametrize("folder", ["missing", "no_tokenizer"])
def test_bert_checkpoint_without_tokenizer_files(tmp_path, capsys, folder):
    src = REPO / "tests" / "fixtures" / "checkpoints" / "vse_infty_bert" / "model_best.pth"
    tok = tmp_path / "bert-base-uncased"
    if folder == "no_tokenizer":  # the model's config and weights, but neither vocab.txt nor tokenizer.json
        tok.mkdir()
        (tok / "config.json").write_text("{}")
    err = _import(tmp_path, src, capsys, vocab=tok) if folder == "no_tokenizer" else None
    if folder == "missing":
        out = tmp_path / "runs" / "coco" / "imported"
        assert main(["import-checkpoint", "--format", "vse_infty", "--src", str(src), "--dataset", "coco",
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and not out.exists()
        assert f"{src}: a VSE∞ BERT model needs its tokenizer: pass --vocab DIR" in err
    else:
        assert f"{tok}: no tokenizer files (vocab.txt or tokenizer.json) for the BERT model {src}" in err
    assert "huggingface-cli download bert-base-uncased" in err


@pytest.mark.parametrize("change, words", [("missing", ["missing keys txt_enc.gpool.linear.weight"]),
                                           ("unexpected", ["unexpected keys img_enc.extra.weight"])])
def test_missing_or_unexpected_keys(tmp_path, capsys, change, words):
    ck = _official()
    if change == "missing":
        del ck["model"][1]["gpool.linear.weight"]
    else:
        ck["model"][0]["extra.weight"] = torch.zeros(3)
    src = tmp_path / "model_best.pth"
    torch.save(ck, src)
    err = _import(tmp_path, src, capsys)
    assert f"{src}:" in err and all(w in err for w in words)


def test_an_existing_run_directory_keeps_its_files_on_error(tmp_path, capsys):
    out = tmp_path / "runs" / "coco" / "imported"
    out.mkdir(parents=True)
    shutil.copy2(FIX / "inputs.json", out / "test_sims.npy")
    src = tmp_path / "bad.pth"
    src.write_text("no")
    rc = main(["import-checkpoint", "--format", "vse_infty", "--src", str(src), "--vocab",
               str(FIX / "coco_precomp_vocab.json"), "--dataset", "coco", "--out", str(out)])
    assert rc == 2 and sorted(os.listdir(out)) == ["test_sims.npy"]


def test_pvse_checkpoint_given_as_pcme(tmp_path, capsys):
    src = REPO / "tests" / "fixtures" / "checkpoints" / "pvse" / "tiny_k2.pth"
    err = _import(tmp_path, src, capsys, vocab=None, fmt="pcme")
    assert f"{src}: a PVSE checkpoint" in err and "--format pvse" in err


@pytest.mark.parametrize("payload", ["random_state", "object_array"])
def test_numpy1_pickle_with_a_class_outside_the_allow_list(tmp_path, capsys, payload):
    """A numpy-1 era file whose metadata holds something the allow-list does not rebuild: refused by name, nothing
    of it runs."""
    import sys

    import numpy as np

    sys.path.insert(0, str(FIX.parent))
    import py2pickle

    ck = _official()
    # a trainer's RNG state (numpy.random pickles through its own constructor), or an array of Python objects
    ck["metadata"] = {"scores": np.float64(1.5), "extra": np.random.RandomState(0) if payload == "random_state"
                      else np.array([1, "a"], dtype=object)}
    src = tmp_path / "model_best.pth"
    torch.save(ck, src, pickle_module=py2pickle.numpy1)
    err = _import(tmp_path, src, capsys)
    want = "refuses to load numpy.random._pickle.__randomstate_ctor" if payload == "random_state" else \
        "refuses to load numpy.dtypes.ObjectDType"
    assert f"{src}: {want}" in err, err


def test_pickled_vocabulary_where_json_is_expected(tmp_path, capsys):
    vocab = REPO / "tests" / "fixtures" / "checkpoints" / "vsepp" / "coco_precomp_vocab.pkl"
    err = _import(tmp_path, FIX / "model_best.pth", capsys, vocab=vocab)
    assert f"{vocab}: a pickled vocabulary, but --format vse_infty reads SCAN's vocabulary json" in err
    assert "coco_precomp_vocab.json" in err


@pytest.mark.parametrize("fmt,folder,src,vocab,backbone,sizes", [
    ("vse_infty", "vse_infty", "model_best.pth", "coco_precomp_vocab.json", "efficientnet_lite0", (1280, 2048)),
    ("vsepp", "vsepp", "model_best.pth.tar", "coco_precomp_vocab.pkl", "resnet152_224", (2048, 4096)),
])
def test_backbone_whose_feature_size_does_not_fit_the_image_layer(tmp_path, capsys, fmt, folder, src, vocab,
                                                                  backbone, sizes):
    """Refused at import (not later in `xmr score` with a matrix-shape RuntimeError), naming both sizes."""
    fix = FIX.parent / folder
    err = _import(tmp_path, fix / src, capsys, vocab=fix / vocab, fmt=fmt,
                  extra=("--set", f"features.backbone={backbone}"))
    assert f"features.backbone={backbone}: its features are {sizes[0]}-d but the checkpoint's image layer takes " \
           f"{sizes[1]}-d inputs" in err


# -- the one loader of old pickles: containers as the 2018-2021 stacks wrote them ----------------------------------
@pytest.mark.parametrize("container,numpy_names", [("zip", "numpy1"), ("zip", "numpy2"), ("pre-zip", "numpy1"),
                                                    ("pre-zip", "numpy2"), ("python2", "numpy1")])
def test_old_pickles_load_as_plain_values(tmp_path, container, numpy_names):
    """Zip and pre-zip torch files, Python 2 byte strings, storages tagged cuda:0, float16 tensors, and numpy
    scalars/dtypes/arrays under numpy 1's (numpy.core) or numpy 2's (numpy._core) names: read onto the CPU, numpy
    values as plain Python numbers and ndarrays."""
    import sys

    import numpy as np

    from xmr.checkpoints.base import load_official

    sys.path.insert(0, str(FIX.parent))
    import py2pickle

    weights = torch.arange(6, dtype=torch.float16).reshape(2, 3) / 7
    ck = {"model": {"fc.weight": weights}, "opt": argparse.Namespace(lr=np.float64(2e-4), name="caf\xe9"),
          "metadata": {"scores": {"medr": np.float64(2.0), "count": np.int64(5), "r1": np.float32(0.5)},
                       "curve": np.array([1.0, 2.5])}}
    src = tmp_path / "ck.pth"
    kwargs = {"zip": {}, "pre-zip": {"_use_new_zipfile_serialization": False},
              "python2": {"_use_new_zipfile_serialization": False, "pickle_protocol": 2}}[container]
    module = py2pickle if container == "python2" else (py2pickle.numpy1 if numpy_names == "numpy1" else None)
    with py2pickle.cuda_tagged():
        torch.save(ck, src, **kwargs, **({"pickle_module": module} if module else {}))
    raw = src.read_bytes()
    assert (raw[:2] == b"PK") == (container == "zip")
    if container != "zip":
        assert b"cuda:0" in raw and (b"numpy.core.multiarray" in raw) == (numpy_names == "numpy1")
    got = load_official(src, [argparse.Namespace])
    assert got["model"]["fc.weight"].dtype == torch.float16 and torch.equal(got["model"]["fc.weight"], weights)
    assert got["model"]["fc.weight"].device.type == "cpu"
    assert got["opt"].lr == 2e-4 and type(got["opt"].lr) is float and got["opt"].name == "caf\xe9"
    assert got["metadata"]["scores"] == {"medr": 2.0, "count": 5, "r1": 0.5}
    assert all(type(v) in (float, int) for v in got["metadata"]["scores"].values())
    assert type(got["metadata"]["curve"]) is np.ndarray and got["metadata"]["curve"].tolist() == [1.0, 2.5]
