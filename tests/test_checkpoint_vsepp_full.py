"""VSE++'s full-image models (fartashf/vsepp, ``--cnn_type resnet152|vgg19 --finetune``), imported with the command
docs/checkpoints.md prints, give the reference code's embeddings of image files and raw captions within 1e-5.

Fixture (tests/fixtures/checkpoints/vsepp_full/, made by its make_fixture.py with the reference's own model, test
transform and tokenization): the weights' layout (drawn here by the seed rule, weights.py), two JPEG files, the
captions, the reference's ``opt`` and its embeddings. The checkpoint is written here as the released files are:
``{'model': [img_enc, txt_enc], 'opt': Namespace, ...}``, pre-zip torch format, Python 2 strings, the CNN's
DataParallel segment inside the keys (``cnn.module.*``, ``cnn.features.module.*``), VGG's old classifier names
``cnn.classifier.1/4`` and no BatchNorm ``num_batches_tracked`` (torch 0.3).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_xmr
from tests.fixtures.checkpoints.seeded import state_from_layout
from tests.fixtures.checkpoints.vsepp_full.weights import released_image_state, without_cnn_biases

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "checkpoints" / "vsepp_full"
INPUTS = json.loads((FIX / "inputs.json").read_text())
TOL = 1e-5


def write_released_file(path: Path, cnn_type: str) -> None:
    sys.path.insert(0, str(FIX.parent))
    import py2pickle  # the fixture's Python 2 pickler (byte strings, as the released files)

    layout = json.loads((FIX / f"layout_{cnn_type}.json").read_text())
    img = released_image_state(without_cnn_biases(state_from_layout(layout["img"])), cnn_type)
    ck = {"model": [img, state_from_layout(layout["txt"])], "opt": argparse.Namespace(**INPUTS["opt"][cnn_type]),
          "epoch": 12, "best_rsum": 401.5, "Eiters": 20000}
    torch.save(ck, path, pickle_module=py2pickle, pickle_protocol=2, _use_new_zipfile_serialization=False)


def import_and_compare(tmp_path: Path, cnn_type: str) -> dict:
    import xmr

    src = tmp_path / "model_best.pth.tar"
    write_released_file(src, cnn_type)
    run = tmp_path / "runs" / "coco" / "vsepp_official"
    # docs/checkpoints.md's command, the file paths changed; no --set: the file says what it is
    r = run_xmr("import-checkpoint", "--format", "vsepp", "--src", src, "--vocab", FIX / "coco_vocab.pkl",
                "--dataset", "coco", "--out", run, cwd=REPO)
    assert r.returncode == 0, r.stderr
    recipe_run = None
    if cnn_type == "resnet152":  # the zoo recipe's way (rule import_checkpoint), the file where its src would be
        recipe_run = tmp_path / "runs" / "coco" / "vsepp_official_resnet152"
        r = run_xmr("import-checkpoint", "--recipe", "config/recipes/coco/vsepp_official_resnet152.yaml", "--src", src,
                    "--vocab", FIX / "coco_vocab.pkl", "--out", recipe_run, cwd=REPO)
        assert r.returncode == 0, r.stderr
    src.unlink()  # the run holds its own copy of the weights
    expected = np.load(FIX / f"expected_{cnn_type}.npz")
    model = xmr.load(run, device="cpu")
    img = model.encode_image([FIX / name for name in INPUTS["images"]])
    cap = model.encode_text(INPUTS["captions"])
    np.testing.assert_allclose(img, expected["img_emb"], atol=TOL, rtol=0)
    np.testing.assert_allclose(cap, expected["cap_emb"], atol=TOL, rtol=0)
    np.testing.assert_allclose(model.similarity(img, cap), expected["sims"], atol=TOL, rtol=0)
    # the fixture can tell the images apart (weights.py): far more than the tolerance
    assert np.abs(expected["img_emb"][0] - expected["img_emb"][1]).max() > 100 * TOL
    if recipe_run is not None:  # the same model and preprocessing as the documented command's run
        by_recipe = xmr.load(recipe_run, device="cpu")
        for section in ("features", "model", "text"):
            assert by_recipe.cfg[section] == model.cfg[section], section
        np.testing.assert_allclose(by_recipe.encode_image([FIX / INPUTS["images"][0]]),
                                   expected["img_emb"][:1], atol=TOL, rtol=0)
    return {"config": model.cfg, "provenance": json.loads((run / "provenance.json").read_text())}


@pytest.mark.slow
def test_resnet152_full_image_model_equals_the_reference(tmp_path, one_thread):
    got = import_and_compare(tmp_path, "resnet152")
    cfg, prov = got["config"], got["provenance"]["reported"]
    assert cfg["features"]["source"] == "images" and cfg["features"]["backbone"] == "resnet152_224_torchvision"
    assert cfg["model"]["image_encoder"] == "full_image" and cfg["text"]["tokenizer"] == "nltk"
    assert prov["variant"] == "full image, resnet152" and prov["added_num_batches_tracked"] == 155  # 151 BN + 4 ds


@pytest.mark.slow
def test_vgg19_full_image_model_with_old_classifier_names_equals_the_reference(tmp_path, one_thread):
    got = import_and_compare(tmp_path, "vgg19")
    cfg, prov = got["config"], got["provenance"]["reported"]
    assert cfg["features"]["backbone"] == "vgg19_224_torchvision" and cfg["model"]["image_encoder"] == "full_image"
    assert prov["variant"] == "full image, vgg19" and prov["renamed_old_vgg_classifier"] is True


# -- bad input: one line naming the file and what is wrong (no weights needed) --------------------------------------
@pytest.mark.parametrize("keys,opt,message", [
    (["cnn.module.conv1.weight", "cnn.module.layer1.0.conv3.weight", "cnn.module.layer3.0.conv1.weight"],
     {"cnn_type": "resnet50"}, "opt.cnn_type is resnet50 but the CNN's keys are a resnet152"),
    (["cnn.module.conv1.weight", "cnn.module.layer1.0.conv3.weight", "cnn.module.layer3.0.conv1.weight"],
     {}, "is not a ResNet-152 (layer3 has 1 blocks, not 36)"),
    (["cnn.features.module.0.weight", "cnn.classifier.1.weight", "cnn.classifier.6.weight"], {},
     "unexpected keys img_enc.cnn.classifier.6.weight"),
    (["cnn.conv1.weight"], {"cnn_type": "alexnet"}, "neither a ResNet-152 (cnn.module.*) nor a VGG19"),
])
def test_full_image_files_that_are_not_the_released_variants_are_one_line_errors(keys, opt, message):
    from xmr.checkpoints.vsepp_full import read_full_image
    from xmr.core.errors import XmrError

    src = Path("runs/coco_vse++_x/model_best.pth.tar")
    with pytest.raises(XmrError) as e:
        read_full_image({k: torch.zeros(1) for k in keys}, opt, src)
    assert str(src) in str(e.value) and message in str(e.value) and "\n" not in str(e.value)
