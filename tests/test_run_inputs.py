"""One record of what a run reads (xmr/run/inputs.py): rebuilding any input of the training split (image features,
precomputed text features, annotations, backbone weights) stops a run from resuming onto its old last.pt, and
rebuilding any input of a split makes that split's gallery cache stale. Before the record, the resume digest left
out precomputed text features: an RRF run resumed from a last.pt made with old HGLMM features."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import TinySynth

from xmr.data import load_split
from xmr.run.gallery_cache import read_gallery
from xmr.inference.model import score_split
from xmr.run.config import load_run_config, load_saved_config
from xmr.run.inputs import RunInputs
from xmr.text.hglmm import write_text_features
from xmr.train.trainer import train
from xmr.settings.run_settings import run_settings

RESTART = "was trained with other input files"


@pytest.fixture
def own_synth(tiny_synth, tmp_path) -> TinySynth:
    """A copy of the tiny synth set (config, data, features) that a test may rebuild files of, plus toy
    precomputed text features (what `xmr text-features` writes: one row per caption of each split)."""
    root = tmp_path / "synth"
    for part in ("config", "data", "features"):
        shutil.copytree(tiny_synth.root / part, root / part)
    ds_file = root / "config" / "datasets" / "synth.yaml"
    ds_file.write_text(ds_file.read_text().replace(str(tiny_synth.root), str(root)))
    synth = TinySynth(root)
    from xmr.config.loader import load_dataset_config

    dcfg = load_dataset_config("synth", synth.config_dir)
    rng = np.random.default_rng(0)
    for split in ("train", "val", "test"):
        data = load_split(dcfg, split)
        write_text_features(root / "features" / "synth" / "toytext" / f"{split}.h5",
                            rng.standard_normal((data.num_captions, 16)), list(data.captions),
                            data.caption_image, list(data.image_ids), {"kind": "toytext"})
    return synth


def rebuild_image_features(synth: TinySynth, cfg: dict) -> None:
    with h5py.File(RunInputs.of(run_settings(cfg), "train").image_features, "r+") as f:
        f["features"][0] = f["features"][0] * 2


def rebuild_text_features(synth: TinySynth, cfg: dict) -> None:
    with h5py.File(RunInputs.of(run_settings(cfg), "train").text_features, "r+") as f:
        f["features"][0] = f["features"][0] + 1


def rebuild_annotations(synth: TinySynth, cfg: dict) -> None:
    path = RunInputs.of(run_settings(cfg), "train").annotations[0]
    path.write_text(json.dumps(json.loads(path.read_text()), indent=1))  # the same data, written anew


RECIPES = {  # kind -> (method, recipe sections, rebuild)
    "image_features": ("vsepp", {}, rebuild_image_features),
    "annotations": ("vsepp", {}, rebuild_annotations),
    "text_features": ("rrf", {"model": {"embed_dim": 32, "hidden_dim": 64, "steps": 2}, "loss": {"n_neg": 5},
                              "features": {"text": "toytext"}}, rebuild_text_features),
}


@pytest.mark.parametrize("kind", list(RECIPES))
def test_a_rebuilt_input_blocks_the_resume_and_stales_the_gallery(own_synth, tmp_path, capsys, kind):
    method, sections, rebuild = RECIPES[kind]
    features = {"backbone": "efficientnet_lite0", "dir": str(own_synth.features_dir), **sections.pop("features", {})}
    cfg = load_run_config(own_synth.recipe(method, name=f"{method}_{kind}", features=features, **sections))
    assert kind in RunInputs.of(run_settings(cfg), "train").files() or kind == "annotations"
    out = tmp_path / "run"
    train(cfg, out, progress=False)
    score_split(out, "train", device="cpu", progress=False)  # caches the training split's gallery
    saved = load_saved_config(out)
    assert read_gallery(out, run_settings(saved), "train") is not None
    capsys.readouterr()
    train(cfg, out, progress=False)  # nothing changed: the finished run is resumed
    assert f"resuming {out} after epoch 1" in capsys.readouterr().out

    rebuild(own_synth, cfg)
    assert read_gallery(out, run_settings(saved), "train") is None  # stale: recomputed by the next reader
    train(cfg, out, progress=False)
    printed = capsys.readouterr().out
    assert f"{out / 'last.pt'} {RESTART}" in printed and "resuming" not in printed


@pytest.mark.slow  # three end-to-end trainings (~35 s on 2 shared cores)
def test_rebuilt_backbone_weights_block_the_resume_of_an_end_to_end_run(own_synth, tmp_path, capsys, monkeypatch):
    """End to end, the pretrained weights file is an input of training (the model starts from it); the gallery of
    a trained run is made from best.pt, which holds the fine-tuned backbone, so it does not depend on the file."""
    import xmr.features.backbones.efficientnet as efficientnet

    cfg = load_run_config(own_synth.recipe("vse_inf", name="e2e_weights", features={
        "backbone": "efficientnet_lite0", "dir": str(own_synth.features_dir), "source": "images"}))
    record = RunInputs.of(run_settings(cfg), "train")
    assert record.end_to_end and record.image_features is None and "image_features" not in record.files()
    out = tmp_path / "run"
    train(cfg, out, progress=False)
    capsys.readouterr()
    train(cfg, out, progress=False)
    assert f"resuming {out} after epoch 1" in capsys.readouterr().out
    monkeypatch.setattr(efficientnet, "sha256_file", lambda p: "0" * 64)
    train(cfg, out, progress=False)  # the backbone now reports other weights: as if the file were replaced
    printed = capsys.readouterr().out
    assert f"{out / 'last.pt'} {RESTART}" in printed and "resuming" not in printed


def test_the_workflow_the_gallery_and_the_digest_name_the_same_files(own_synth):
    from xmr.planning.workflow_inputs import run_split_inputs
    from xmr.run.gallery_cache import input_files

    cfg = load_run_config(own_synth.recipe("rrf", name="rrf_files", features={
        "backbone": "efficientnet_lite0", "dir": str(own_synth.features_dir), "text": "toytext"}))
    fdir = own_synth.features_dir / "synth"
    ann = Path(cfg["dataset_cfg"]["annotations"])
    assert input_files(run_settings(cfg), "test") == {"image_features": fdir / "efficientnet_lite0" / "test.h5",
                                        "text_features": fdir / "toytext" / "test.h5", "annotations_0": ann}
    assert run_split_inputs(None, "test", cfg=cfg) == {"images": [str(fdir / "efficientnet_lite0" / "test.h5")],
                                                       "text_features": [str(fdir / "toytext" / "test.h5")]}
    _, parts = RunInputs.of(run_settings(cfg), "train").digest()
    assert set(parts) == {"features_sha256", "text_features_sha256", "annotations_0_sha256"}


def test_dvc_train_stages_depend_on_what_their_recipes_read():
    # DVC reruns a train stage when a dependency changes: a stage that lists too little misses a rebuilt input; one
    # that lists a parent folder (RRF once listed all of features/synth) reruns when another recipe's features change
    import yaml

    repo = Path(__file__).resolve().parents[1]
    doc = yaml.safe_load((repo / "dvc.yaml").read_text())
    stages = next(v["train"] for v in doc["vars"] if "train" in v)
    recipes = {p.stem: RunInputs.of(run_settings(load_run_config(p)), "train")
               for p in sorted((repo / "config" / "recipes" / "synth").glob("*.yaml"))}
    # every synth recipe on precomputed features has its stage (end to end, vse_inf_e2e, is trained by hand)
    assert {item["recipe"] for item in stages.values()} == {r for r, i in recipes.items() if not i.end_to_end}
    for name, item in stages.items():
        assert name == f"{item['dataset']}-{item['recipe']}"
        inputs = recipes[item["recipe"]]
        assert Path(item["features"]) == inputs.image_features.parent, name
        (annotations,) = inputs.annotations
        text = inputs.text_features.parent if inputs.text_features else annotations
        assert Path(item["text"]) == text, name
    assert stages["synth-rrf"]["text"] == "features/synth/hglmm"  # the one recipe on precomputed caption features
    # and the stage that makes those features reads the captions only, as its Snakemake rules do
    data_deps = [d for d in doc["stages"]["text_features"]["do"]["deps"] if d.startswith("data/")]
    assert [d.replace("${item}", "synth") for d in data_deps] == [str(a) for a in recipes["rrf"].annotations]
