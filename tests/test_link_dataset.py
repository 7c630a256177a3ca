"""`xmr link-dataset` / xmr.data.link: a user's copy of a real dataset symlinked into data/{dataset}/."""

from __future__ import annotations

import json
import re

import pytest

from xmr.core.errors import XmrError
from xmr.data.link import link_dataset, link_rule_constraints, linkable_annotations


def coco_cfg(root, source=None) -> dict:
    return {"name": "coco", "root": str(root), "annotations": str(root / "dataset_coco.json"),
            "images": str(root / "images"), "source": source, "obtain": "download dataset_coco.json"}


def make_source(path):
    (path / "images" / "val2014").mkdir(parents=True)
    (path / "dataset_coco.json").write_text(json.dumps({"images": []}))
    return path


def test_no_source_names_the_file_and_the_remedy(tmp_path):
    cfg = coco_cfg(tmp_path / "data" / "coco")
    with pytest.raises(XmrError) as e:
        link_dataset(cfg)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path}/data/coco/dataset_coco.json: not found; download dataset_coco.json")
    assert "`source:` in config/datasets/coco.yaml" in msg
    assert "\n" not in msg
    assert not (tmp_path / "data").exists()  # nothing half-made


def test_links_every_entry_and_keeps_existing_ones(tmp_path):
    src = make_source(tmp_path / "share")
    (src / "README").write_text("x")
    root = tmp_path / "data" / "coco"
    (root / "images").mkdir(parents=True)            # an empty folder (what Snakemake makes for outputs) ...
    (root / "README").write_text("mine")              # ... is replaced; a real entry is kept
    made = link_dataset(coco_cfg(root), source=src)
    assert sorted(p.name for p in made) == ["dataset_coco.json", "images"]
    assert (root / "dataset_coco.json").resolve() == (src / "dataset_coco.json").resolve()
    assert (root / "images" / "val2014").is_dir() and (root / "images").is_symlink()
    assert (root / "README").read_text() == "mine"
    assert link_dataset(coco_cfg(root), source=src) == []  # idempotent


def test_source_from_config_and_a_source_without_the_annotations(tmp_path):
    src = make_source(tmp_path / "share")
    root = tmp_path / "data" / "coco"
    assert [p.name for p in link_dataset(coco_cfg(root, source=str(src)))] == ["dataset_coco.json", "images"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(XmrError, match=re.escape(f"{empty}/dataset_coco.json: not found in the source folder")):
        link_dataset(coco_cfg(tmp_path / "other"), source=empty)
    with pytest.raises(XmrError, match="source .*nowhere: not a folder"):
        link_dataset(coco_cfg(tmp_path / "other"), source=tmp_path / "nowhere")


def test_rule_constraints_cover_the_real_datasets_only():
    table = linkable_annotations("config")
    assert table == {"coco": "dataset_coco.json", "cub": "CUB_200_2011/images.txt", "f30k": "dataset_flickr30k.json"}
    c = link_rule_constraints("config")
    assert re.fullmatch(c["dataset"], "coco") and not re.fullmatch(c["dataset"], "synth")
    assert re.fullmatch(c["annotations"], "CUB_200_2011/images.txt")
    assert not re.fullmatch(c["annotations"], "precomp/train_ims.npy")


def test_cli_exits_nonzero_with_one_line(tmp_path, monkeypatch, capsys):
    from xmr.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config" / "datasets").mkdir(parents=True)
    (tmp_path / "config" / "datasets" / "coco.yaml").write_text(
        "name: coco\nformat: karpathy\nroot: data/coco\nannotations: data/coco/dataset_coco.json\n"
        "captions_per_image: 5\nobtain: download it\n")
    assert main(["link-dataset", "--dataset", "coco"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["xmr link-dataset: error: data/coco/dataset_coco.json: not found; download it, or set `source:` in "
                   "config/datasets/coco.yaml to a folder laid out like data/coco/ (docs/datasets.md)"]
