"""VSE∞ grid models (woodfrog/vse_infty, ``--precomp_enc_type backbone``: the CNN inside the file), imported with the
documented command, give the reference code's embeddings end to end from image files and raw captions.

The fixture (tests/fixtures/checkpoints/vse_infty_grid/, made by its make_fixture.py from the reference's own model
and test data path, with the real cv2 resize) holds, per released family, the checkpoint's layout, the reference's
``opt``, image files and what the reference computed. The weights are drawn by the seed rule (seeded.py), with
the alias keys ``backbone.base.*``/``backbone.top.*`` sharing the ``backbone.resnet.*`` tensors as in the
reference's state dict; the container is written as its train.py saves it (``module.`` keys, ``opt`` a Namespace).
Input: ``opt.input_scale_factor 0.25`` (64 x 64; the released models' 2.0 gives 512 by the same code path).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import xmr
from tests.conftest import remove_unless_failed, run_xmr
from tests.fixtures.checkpoints.seeded import seeded_tensor
from xmr.core.errors import XmrError

REPO = Path(__file__).resolve().parents[1]
CK = REPO / "tests" / "fixtures" / "checkpoints"
FIX = CK / "vse_infty_grid"
IMAGES = [FIX / "images" / n for n in ("rgb_100x72.jpg", "grey_150x130.jpg", "rgb_50x40.png", "rgb_90x120.jpg")]
CAPTIONS = json.loads((FIX / "captions.json").read_text())["captions"]  # the set the expected files were made from
BIGRU_VOCAB = CK / "vse_infty" / "coco_precomp_vocab.json"
BERT_DIR = CK / "vse_infty_bert" / "bert_tiny"
# released family -> (--vocab, the backbones.yaml key the import must pick)
MODELS = {"butd_grid_bigru": (BIGRU_VOCAB, "butd_r101_grid_512"),
          "butd_grid_bert": (BERT_DIR, "butd_r101_grid_512"),
          "wsl_grid_bert": (BERT_DIR, "resnext101_wsl_512_inter_linear")}
TOL = 1e-5


def released_file(name: str, path: Path) -> Path:
    """The fixture's checkpoint in the released container: seed-rule tensors, aliases sharing theirs."""
    states: dict[str, dict] = {"img": {}, "txt": {}}
    for part, key, shape, dtype, alias in json.loads((FIX / name / "layout.json").read_text()):
        states[part][key] = states[part][alias] if alias else seeded_tensor(f"{part}.{key}", shape, dtype)
    opt = argparse.Namespace(**json.loads((FIX / name / "opt.json").read_text()))
    torch.save({"model": [states["img"], states["txt"]], "opt": opt, "epoch": 24, "best_rsum": 512.3,
                "Eiters": 1000}, path)
    return path


@pytest.fixture(scope="module")
def released(module_tmp):
    """name -> the released-layout file of that family (written once per module)."""
    folder, files = module_tmp("released"), {}

    def get(name: str) -> Path:
        if name not in files:
            (folder / name).mkdir()
            files[name] = released_file(name, folder / name / "model_best.pth")
        return files[name]

    return get


@pytest.fixture(scope="module", params=list(MODELS))
def imported(request, released, module_tmp):
    """(name, run dir): the documented command, as printed, with the paths changed."""
    name, failed_before = request.param, request.session.testsfailed
    folder = module_tmp(name)
    out = folder / "runs" / "coco" / f"vse_inf_official_{name}"
    run_xmr("import-checkpoint", "--format", "vse_infty", "--src", released(name), "--vocab", MODELS[name][0],
            "--dataset", "coco", "--out", out, check=True)
    yield name, out
    remove_unless_failed(request.session, failed_before, [folder])  # 160-330 MB a family: gone once its tests pass


# each family: a ResNet-101/ResNeXt-101 drawn, written, imported (a subprocess) and loaded: 15-30 s on 2 cores
@pytest.mark.slow
def test_grid_model_gives_the_reference_embeddings_from_image_files(imported, one_thread):
    name, out = imported
    m = xmr.load(out, device="cpu")
    img = m.encode_image([str(p) for p in IMAGES])
    cap = m.encode_text(CAPTIONS)
    np.testing.assert_allclose(img, np.load(FIX / name / "expected_img_emb.npy"), atol=TOL, rtol=0)
    np.testing.assert_allclose(cap, np.load(FIX / name / "expected_cap_emb.npy"), atol=TOL, rtol=0)


@pytest.mark.slow
def test_the_file_decides_the_image_side(imported):
    name, out = imported
    from xmr.config.loader import load_yaml

    cfg = load_yaml(out / "config.yaml")
    assert cfg["features"]["source"] == "images" and cfg["features"]["backbone"] == MODELS[name][1]
    assert cfg["image_backbone"]["input_size"] == 64  # 256 x opt.input_scale_factor 0.25
    assert cfg["model"]["residual_mlp"] is False and cfg["model"]["l2_norm"] == "plus_eps"
    assert cfg["text"]["encoder"] == ("bigru" if name.endswith("bigru") else "bert")
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["reported"]["dropped_unused_keys"] == ["backbone.resnet.fc.bias", "backbone.resnet.fc.weight"]
    assert prov["reported"]["module_prefix"] == {"image": True, "text": True}


@pytest.mark.parametrize("name", ["butd_grid_bigru", "wsl_grid_bert"])
def test_resize_and_normalisation_equal_the_reference(name):
    """xmr's ``squash_inter_linear`` (torch bilinear, half-pixel centres, no antialias) and the backbone's
    normalisation against the reference's network input (cv2.resize INTER_LINEAR of the float image, then BGR
    minus the Caffe means, or ImageNet mean/std). Shrinking (grey 150 x 130, made 3-channel) and enlarging (50 x 40).
    Tolerance: float error of the same weights computed in another order (exact at these sizes when written;
    1e-3 grey levels allowed, i.e. 4e-6 of the range)."""
    from xmr.core.registry import import_submodules
    from xmr.features.backbones import BACKBONES
    from xmr.features.decode import read_image
    from xmr.features.extract import normalise

    import_submodules("xmr.features.backbones")
    backbone = BACKBONES.get("caffe_resnet101" if name.startswith("butd") else "resnext101_32x8d")
    expected = np.load(FIX / name / "processed.npy")
    for row, i in enumerate((1, 2)):  # the images make_fixture.py kept
        x, _ = read_image(IMAGES[i], 64, "squash_inter_linear")
        assert x.dtype == torch.float32 and x.shape == (3, 64, 64)
        net_input = normalise(x[None], backbone.mean, backbone.std, pixel_scale=backbone.pixel_scale)[0]
        if name.startswith("butd"):
            net_input = net_input.flip(0)  # the Caffe backbone's forward reads BGR
            np.testing.assert_allclose(net_input.numpy(), expected[row], atol=1e-3, rtol=0)
        else:
            np.testing.assert_allclose(net_input.numpy(), expected[row], atol=1e-3 / 255 / 0.225, rtol=0)


def test_caffe_resnet_is_not_torchvision_resnet():
    """The two Caffe differences in the architecture (the third, BGR minus means, is in the test above): the
    bottleneck's stride sits on its 1x1 conv1, and the stem's max-pool (padding 0, ceil_mode) gives 17 x 17 where
    torchvision's (padding 1, floor) gives 18 x 18 on a 70 px input (a 35 px map after conv1)."""
    import torchvision

    from xmr.features.backbones.caffe_resnet import caffe_resnet_trunk

    trunk = caffe_resnet_trunk((3, 4, 23, 3))
    assert trunk[5][0].conv1.stride == (2, 2) and trunk[5][0].conv2.stride == (1, 1)
    tv = torchvision.models.resnet101(weights=None)
    x = torch.zeros(1, 3, 70, 70)
    with torch.no_grad():
        assert trunk[:4](x).shape[-1] == 17
        assert tv.maxpool(tv.relu(tv.bn1(tv.conv1(x)))).shape[-1] == 18


# -- bad input: one line naming the file and what to do, no run directory ------------------------------------
@pytest.mark.slow
def test_grid_model_given_a_region_recipe(released, tmp_path):
    src = released("butd_grid_bigru")
    out = tmp_path / "runs" / "coco" / "x"
    r = run_xmr("import-checkpoint", "--recipe", REPO / "config" / "recipes" / "coco" / "vse_inf_official_bigru.yaml",
                "--src", src, "--vocab", BIGRU_VOCAB, "--out", out)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, r.stderr
    assert str(src) in err and "vse_inf_official_bigru.yaml" in err and "butd_r101_k36" in err
    assert "give the recipe made for this model" in err and not out.exists()


def _tiny_grid(**edits) -> dict:
    """A grid image state with the reference's key names (tiny tensors: the alias check comes first)."""
    state = {"backbone.resnet.conv1.weight": torch.ones(2), "backbone.resnet.layer4.0.conv1.weight": torch.ones(3),
             "backbone.resnet.fc.weight": torch.ones(1), "backbone.base.0.weight": torch.ones(2),
             "backbone.top.0.0.conv1.weight": torch.ones(3)}
    state.update(edits)
    return {k: v for k, v in state.items() if v is not None}


def test_alias_keys_must_hold_the_same_tensors():
    from xmr.checkpoints.vse_infty import resolved_backbone

    assert set(resolved_backbone(_tiny_grid(), Path("m.pth"))) == {"conv1.weight", "layer4.0.conv1.weight"}
    with pytest.raises(XmrError, match=r"m.pth: img_enc.backbone.top.0.0.conv1.weight differs from "
                                       r"img_enc.backbone.resnet.layer4.0.conv1.weight"):
        resolved_backbone(_tiny_grid(**{"backbone.top.0.0.conv1.weight": torch.zeros(3)}), Path("m.pth"))
    with pytest.raises(XmrError, match="do not cover the same tensors"):
        resolved_backbone(_tiny_grid(**{"backbone.base.0.weight": None}), Path("m.pth"))
    with pytest.raises(XmrError, match="unexpected key img_enc.backbone.extra.weight"):
        resolved_backbone(_tiny_grid(**{"backbone.extra.weight": torch.ones(1)}), Path("m.pth"))
    with pytest.raises(XmrError, match="unexpected key img_enc.backbone.resnet.layer5.0.conv1.weight"):
        resolved_backbone({"backbone.resnet.layer5.0.conv1.weight": torch.ones(1)}, Path("m.pth"))


def test_caffe_backbone_weights_file_names():
    """``weights:`` of butd_r101_grid_512: VSE∞'s original_updown_backbone.pth ({'base', 'top'}: its two
    Sequentials) or ResNet names, onto the trunk's indices (conv1 0, bn1 1, layer1..4 4..7)."""
    from xmr.features.backbones.caffe_resnet import trunk_state

    one = torch.ones(1)
    got = trunk_state({"base": {"0.weight": one, "4.0.conv1.weight": one}, "top": {"0.2.bn3.bias": one}}, "w.pth")
    assert set(got) == {"0.weight", "4.0.conv1.weight", "7.2.bn3.bias"}
    got = trunk_state({"module.conv1.weight": one, "layer4.2.bn3.bias": one, "fc.weight": one}, "w.pth")
    assert set(got) == {"0.weight", "7.2.bn3.bias"}
    with pytest.raises(XmrError, match="w.pth: unexpected key head.weight"):
        trunk_state({"head.weight": one}, "w.pth")


def test_opt_and_weights_must_agree_on_grid_or_region(tmp_path):
    """The region fixture's file with ``opt.precomp_enc_type`` claiming a grid model."""
    from xmr.checkpoints.vse_infty import read_vse_infty

    with torch.serialization.safe_globals([argparse.Namespace]):
        ck = torch.load(CK / "vse_infty" / "model_best.pth", weights_only=True)
    ck["opt"].precomp_enc_type = "backbone"
    src = tmp_path / "model_best.pth"
    torch.save(ck, src)
    with pytest.raises(XmrError, match=r"model_best.pth: opt.precomp_enc_type is 'backbone' but the file holds no CNN"):
        read_vse_infty(src, BIGRU_VOCAB, {})


@pytest.mark.parametrize("decoder", ["pil", "device"])
def test_extract_with_the_caffe_grid_backbone(tmp_path, one_thread, decoder):
    """`xmr extract`'s path (both decoders) gives what the backbone computes on the float squash_inter_linear input
    with its Caffe normalisation: the backbone entry is usable for precomputed grid features too."""
    from xmr.data.base import CaptionedSplit
    from xmr.features.backbones import build_backbone
    from xmr.features.decode import read_image
    from xmr.features.extract import extract_features, normalise
    from xmr.features.store import FeatureFile

    torch.manual_seed(0)
    cfg = {"name": "caffe_resnet101", "allow_random_init": True, "input_size": 64, "resize": "squash_inter_linear",
           "decoder": decoder}
    backbone = build_backbone(cfg)
    split = CaptionedSplit(name="q", split="q", image_ids=[str(i) for i in range(len(IMAGES))], image_paths=IMAGES,
                           captions=[], caption_image=np.zeros(0, dtype=np.int64))
    h5 = extract_features(split, cfg, tmp_path / "q.h5", batch_size=2, workers=0, progress=False, device="cpu",
                          backbone=backbone)
    x = torch.stack([read_image(p, 64, "squash_inter_linear")[0] for p in IMAGES])
    with torch.no_grad():
        want = backbone(normalise(x, backbone.mean, backbone.std, pixel_scale=1.0))[0]
    got = torch.from_numpy(np.stack([np.asarray(FeatureFile(h5)[i]) for i in range(len(IMAGES))]))
    assert got.shape == (4, 4, 2048)  # 2 x 2 grid at 64 px
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # equal when written (features up to ~4)
