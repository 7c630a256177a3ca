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


def _import(tmp_path: Path, src: Path, capsys, vocab: Path = FIX / "coco_precomp_vocab.json",
            fmt: str = "vse_infty") -> str:
    out = tmp_path / "runs" / "coco" / "imported"
    rc = main(["import-checkpoint", "--format", fmt, "--src", str(src), "--vocab", str(vocab), "--dataset", "coco",
               "--out", str(out)])
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
