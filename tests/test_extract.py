"""Feature extraction on real images with real weights, region features from given boxes, backbone configs."""

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import SAMPLE_PHOTOS
from xmr.config.loader import load_backbone_config, validate
from xmr.core.errors import XmrError
from xmr.data import load_split
from xmr.features.backbones import build_backbone
from xmr.features.decode import resize_geometry
from xmr.features.extract import extract_features
from xmr.features.store import FeatureFile

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def photos(module_tmp):
    """A Karpathy-format dataset over scikit-learn's two sample photos (640 x 427 JPEGs)."""
    root = module_tmp("photos")
    images = [{"filename": f, "imgid": i, "split": "test", "sentences": [{"raw": "a photo"}]}
              for i, f in enumerate(["china.jpg", "flower.jpg"])]
    (root / "d.json").write_text(json.dumps({"images": images}))
    cfg = {"name": "photos", "format": "karpathy", "annotations": str(root / "d.json"), "images": str(SAMPLE_PHOTOS),
           "captions_per_image": 1}
    return load_split(cfg, "test"), root


def _bb(name, **kw):
    """A backbone config as config/backbones.yaml gives one: validated, schema defaults filled."""
    return validate({"name": name, "key": name, **kw}, "backbone", f"test backbone {name}")


def test_every_configured_backbone_validates():
    keys = yaml.safe_load((REPO / "config" / "backbones.yaml").read_text())
    for key in keys:
        cfg = load_backbone_config(key, REPO / "config")
        assert cfg["key"] == key


def test_center_crop_geometry_by_hand():
    # 640 x 427, ImageNet eval: shorter side 224 / 0.875 = 256 -> 384 x 256 (640 * 256 / 427 = 383.7), crop 224
    assert resize_geometry(640, 427, 224, "center_crop") == ((384, 256), (80, 16), (224, 224))
    assert resize_geometry(640, 427, 224, "squash") == ((224, 224), (0, 0), (224, 224))
    # BUTD: shorter side 600, longer side capped at 1000: 640 x 427 -> 899 x 600; 1000 x 200 -> 1000 x 200
    assert resize_geometry(640, 427, 600, "shorter_side", 1000) == ((899, 600), (0, 0), (899, 600))
    assert resize_geometry(1000, 200, 600, "shorter_side", 1000)[0] == (1000, 200)


def test_torchvision_center_crop_geometry_by_hand():
    # torchvision Resize(256): 640 x 427 -> int(256 * 640 / 427) = int(383.7) = 383 (center_crop rounds to 384);
    # CenterCrop(224): left = round((383 - 224) / 2) = round(79.5) = 80 (half to even), top = round(16.0) = 16
    assert resize_geometry(640, 427, 224, "torchvision_center_crop") == ((383, 256), (80, 16), (224, 224))
    # 343 x 500 (portrait): 256 x int(256 * 500 / 343) = 256 x 373; top = round(74.5) = 74 (half to even)
    assert resize_geometry(343, 500, 224, "torchvision_center_crop") == ((256, 373), (16, 74), (224, 224))


@pytest.mark.parametrize("w,h", [(640, 427), (343, 500), (500, 375), (333, 333), (1000, 257)])
def test_torchvision_center_crop_equals_torchvision_transforms(w, h):
    """The reference codes' test transform, Resize(256) + CenterCrop(224) of torchvision, pixel for pixel."""
    from PIL import Image
    from torchvision import transforms

    from xmr.features.decode import resize_image

    rng = np.random.default_rng(w * h)
    im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    ref = torch.from_numpy(np.asarray(transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])(im),
                                      dtype=np.uint8).copy()).permute(2, 0, 1)
    got, _ = resize_image(im, 224, "torchvision_center_crop")
    assert torch.equal(got, ref)


def test_real_photos_efficientnet_grid_is_imagenet_meaningful(photos, tmp_path):
    """china.jpg -> 'palace', flower.jpg -> 'daisy': ImageNet top-1 of the mean-pooled stored grid features
    through the real EfficientNet-Lite0 classifier (verifies decoding, RGB order, normalisation, layout)."""
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    split, _ = photos
    cfg = load_backbone_config("efficientnet_lite0", REPO / "config")
    cfg.update(input_size=224, resize="center_crop")
    out = extract_features(split, cfg, tmp_path / "f.h5", batch_size=2, workers=0, progress=False)
    ff = FeatureFile(out)
    assert ff.shape == (2, 49, 1280) and ff.image_ids == ["0", "1"] and not ff.has_boxes
    np.testing.assert_array_equal(ff.image_sizes(), [[640, 427], [640, 427]])
    assert ff.attrs["resize"] == "center_crop" and len(ff.attrs["weights_sha256"]) == 64
    head = build_backbone(cfg).net._fc
    with torch.no_grad():
        logits = head(torch.from_numpy(np.stack([ff[0], ff[1]])).mean(1))
    assert [_IMAGENET_CATEGORIES[i] for i in logits.argmax(1).tolist()] == ["palace", "daisy"]

    # float16 storage: same features, half the bytes
    out16 = extract_features(split, {**cfg, "dtype": "float16"}, tmp_path / "f16.h5", batch_size=2, workers=0,
                             dtype="float16", progress=False)
    f16 = FeatureFile(out16)
    assert f16[0].dtype == np.float16 and f16.attrs["dtype"] == "float16"
    np.testing.assert_allclose(f16[0].astype(np.float32), ff[0], rtol=2e-3, atol=2e-3)


def test_roi_align_whole_image_box_equals_the_pooled_grid(photos, tmp_path):
    """A box covering the whole (non-square) photo, squashed to 224 x 224, lands on the full 7 x 7 map, so
    its RoIAlign 7x7 mean equals the mean of the squash-resized grid features; the box is stored as given."""
    split = dataclasses.replace(photos[0], extra={"boxes": [np.array([[0, 0, 640, 427]], np.float32)] * 2})
    grid = extract_features(split, _bb("efficientnet_lite0", input_size=224, resize="squash"), tmp_path / "g.h5",
                            batch_size=2, workers=0, progress=False)
    roi = extract_features(split, _bb("roi_align", trunk="efficientnet_lite0", boxes="annotations", input_size=224),
                           tmp_path / "r.h5", batch_size=2, workers=0, progress=False)
    g, r = FeatureFile(grid), FeatureFile(roi)
    assert r.shape == (2, 1, 1280)
    np.testing.assert_array_equal(r.num_regions, [1, 1])
    np.testing.assert_allclose(r.boxes()[:, 0], [[0, 0, 640, 427]] * 2, atol=1e-3)
    for i in range(2):
        np.testing.assert_allclose(r[i][0], g[i].mean(0), rtol=1e-4, atol=1e-5)


def _naive_roi_align(fmap, box, scale, out):
    """Reference RoIAlign (aligned=True, adaptive sampling): average of bilinear samples per output bin."""
    c, h, w = fmap.shape
    x1, y1, x2, y2 = [v * scale - 0.5 for v in box]
    bw, bh = (x2 - x1) / out, (y2 - y1) / out
    gw, gh = math.ceil((x2 - x1) / out), math.ceil((y2 - y1) / out)

    def sample(y, x):
        if y < -1 or y > h or x < -1 or x > w:
            return np.zeros(c)
        y, x = max(y, 0.0), max(x, 0.0)
        y0, x0 = int(y), int(x)
        y1_, x1_ = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
        if y0 >= h - 1:
            y0 = y1_ = h - 1
            y = float(y0)
        if x0 >= w - 1:
            x0 = x1_ = w - 1
            x = float(x0)
        ly, lx = y - y0, x - x0
        return ((1 - ly) * (1 - lx) * fmap[:, y0, x0] + (1 - ly) * lx * fmap[:, y0, x1_]
                + ly * (1 - lx) * fmap[:, y1_, x0] + ly * lx * fmap[:, y1_, x1_])

    acc = np.zeros(c)
    for py in range(out):
        for px in range(out):
            for iy in range(gh):
                for ix in range(gw):
                    acc += sample(y1 + py * bh + (iy + 0.5) * bh / gh, x1 + px * bw + (ix + 0.5) * bw / gw)
    return acc / (out * out * gh * gw)


def test_roi_align_heads_against_torchvision_and_a_naive_roi_align():
    import torchvision

    torch.manual_seed(0)
    bb = build_backbone(_bb("roi_align", trunk="resnet18", allow_random_init=True, roi_head="res5"))
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()  # same init: the independent reference
    x = torch.randn(2, 3, 224, 224)
    full = torch.tensor([[0.0, 0.0, 224.0, 224.0]])
    sub = torch.tensor([[30.0, 50.0, 150.0, 210.0]])
    with torch.no_grad():
        pooled = torch.nn.Sequential(*list(net.children())[:-1])(x).flatten(1)  # torchvision's avgpool features
        feats, boxes, counts = bb(x, boxes=[torch.cat([full, sub]), full])
        assert feats.shape == (2, 2, 512) and counts.tolist() == [2, 1]
        np.testing.assert_array_equal(boxes[1, 1].numpy(), [0, 0, 0, 0])  # padding
        # res5 head: RoIAlign 14x14 of the whole C4 map is C4 itself, then layer4 + mean = avgpool
        torch.testing.assert_close(feats[0, 0], pooled[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(feats[1, 0], pooled[1], rtol=1e-4, atol=1e-5)
        bb.roi_head = "c5"
        feats5, _, _ = bb(x, boxes=[sub, full])
        torch.testing.assert_close(feats5[1, 0], pooled[1], rtol=1e-4, atol=1e-5)
        c5 = bb.c5(x)[0].numpy().astype(np.float64)
    np.testing.assert_allclose(feats5[0, 0].numpy(), _naive_roi_align(c5, sub[0].tolist(), 1 / 32, 7),
                               rtol=1e-4, atol=1e-5)


def test_synth_boxes_are_scaled_to_the_input_and_stored_in_pixels(tmp_path):
    from PIL import Image

    from xmr.data.synth import generate_synth

    ann = generate_synth(tmp_path / "synth", n_train=4, n_val=1, n_test=1, image_size=128, progress=False)
    ds = {"name": "synth", "format": "karpathy", "annotations": str(ann), "images": str(tmp_path / "synth" / "images"),
          "captions_per_image": 5}
    split = load_split(ds, "train")
    cfg = load_backbone_config("butd_roi_synth", REPO / "config")
    cfg["input_size"] = 64  # images are 128 px: boxes are halved on the way in, doubled on the way out
    ff = FeatureFile(extract_features(split, cfg, tmp_path / "r.h5", batch_size=3, workers=0, progress=False))
    counts = [len(b) for b in split.extra["boxes"]]
    assert max(counts) >= 2 and ff.shape == (4, max(counts), 1280)
    np.testing.assert_array_equal(ff.num_regions, counts)
    stored = ff.boxes()
    bb = build_backbone(cfg)
    for i, given in enumerate(split.extra["boxes"]):
        np.testing.assert_allclose(stored[i, : len(given)], given, atol=1e-3)
        np.testing.assert_array_equal(stored[i, len(given):], 0)
        im = Image.open(split.image_paths[i]).convert("RGB").resize((64, 64), Image.BILINEAR)
        x = (torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float() / 255 - 0.5) / 0.5
        with torch.no_grad():
            expect, _, _ = bb(x[None], boxes=[torch.from_numpy(given * 0.5)])
        np.testing.assert_allclose(ff[i][: len(given)], expect[0].numpy(), rtol=1e-4, atol=1e-5)
    assert json.loads(ff.attrs["backbone_config"])["trunk"] == "efficientnet_lite0"


def test_region_backbone_errors(photos, tmp_path):
    split = dataclasses.replace(photos[0], extra={})
    with pytest.raises(XmrError, match="needs per-image boxes, but the dataset has none"):
        extract_features(split, _bb("roi_align", trunk="efficientnet_lite0", boxes="annotations"), tmp_path / "x.h5",
                         workers=0, progress=False)
    with pytest.raises(XmrError, match=r"needs detectron2.*envs/detectron2\.yaml.*--no-build-isolation"):
        extract_features(split, load_backbone_config("butd_r101_k36", REPO / "config"), tmp_path / "x.h5",
                         workers=0, progress=False)
    with pytest.raises(XmrError, match="resize shorter_side needs a region backbone"):
        extract_features(split, _bb("efficientnet_lite0", resize="shorter_side"), tmp_path / "x.h5", workers=0,
                         progress=False)


def _naive_nms(boxes, scores, thresh):
    def iou(a, b):
        iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = iw * ih
        return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)

    keep = []
    for i in np.argsort(-scores, kind="stable"):
        if all(iou(boxes[i], boxes[j]) <= thresh for j in keep):
            keep.append(i)
    return keep


def test_butd_box_selection_matches_the_per_class_loop():
    """butd_select = bottom-up-attention generate_tsv.py: per-class NMS, max class confidence, 10-100 rule."""
    from xmr.features.backbones.detectron2_butd import butd_select

    rng = np.random.default_rng(0)
    k, classes = 40, 6
    xy = rng.uniform(0, 80, size=(k, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(10, 40, size=(k, 2))], 1).astype(np.float32)
    probs = rng.dirichlet(np.ones(classes + 1) * 0.3, size=k).astype(np.float32)
    max_conf = np.zeros(k)
    for c in range(1, classes + 1):
        for i in _naive_nms(boxes, probs[:, c], 0.3):
            max_conf[i] = max(max_conf[i], probs[i, c])
    by_conf = np.argsort(-max_conf, kind="stable")
    for lo, hi, th in ((10, 100, 0.2), (3, 5, 0.2), (36, 36, 0.2), (1, 100, 0.99)):
        got = butd_select(torch.from_numpy(boxes), torch.from_numpy(probs), lo, hi, th).tolist()
        above = np.flatnonzero(max_conf >= th)
        if len(above) < lo:
            expect = by_conf[:lo]
        elif len(above) > hi:
            expect = by_conf[:hi]
        else:
            expect = above
        assert got == list(expect), (lo, hi, th)


def test_detector_box_selection_rule():
    from xmr.features.backbones.roi_align import select_detections

    scores = torch.tensor([0.1, 0.9, 0.3, 0.05, 0.5])
    assert select_detections(scores, 1, 10, 0.2).tolist() == [1, 4, 2]   # all >= 0.2, best first
    assert select_detections(scores, 4, 10, 0.2).tolist() == [1, 4, 2, 0]  # topped up to min_boxes
    assert select_detections(scores, 1, 2, 0.2).tolist() == [1, 4]        # capped at max_boxes
    assert select_detections(scores, 9, 10, 0.2).tolist() == [1, 4, 2, 0, 3]  # fewer proposals than min


def test_torchvision_checkpoint_formats(tmp_path):
    import torchvision

    from xmr.features.backbones.torchvision_grid import torchvision_resnet

    state = torchvision.models.resnet18(weights=None).state_dict()
    wrapped = {"state_dict": {f"module.{k}": v for k, v in state.items() if not k.startswith("fc.")}}
    torch.save(wrapped, tmp_path / "ddp.pth")
    net, digest = torchvision_resnet("resnet18", {"weights": str(tmp_path / "ddp.pth")})
    torch.testing.assert_close(net.layer3[0].conv1.weight, state["layer3.0.conv1.weight"])
    assert len(digest) == 64
    torch.save({k: v for k, v in state.items() if not k.startswith("layer4.")}, tmp_path / "cut.pth")
    with pytest.raises(XmrError, match=r"cut\.pth is missing \d+ weights \(e\.g\. layer4"):
        torchvision_resnet("resnet18", {"weights": str(tmp_path / "cut.pth")})
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(XmrError, match=r"cannot load weights .*junk\.pth"):
        torchvision_resnet("resnet18", {"weights": str(tmp_path / "junk.pth")})
    with pytest.raises(XmrError, match="no `weights:` path configured"):
        torchvision_resnet("resnet18", {})


def test_unreadable_image_is_one_clear_error_from_a_worker_process(tmp_path):
    import shutil

    (tmp_path / "img").mkdir()
    shutil.copy(SAMPLE_PHOTOS / "flower.jpg", tmp_path / "img" / "ok.jpg")
    (tmp_path / "img" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated, not a JPEG")
    images = [{"filename": f, "imgid": i, "split": "test", "sentences": [{"raw": "x"}]}
              for i, f in enumerate(["ok.jpg", "broken.jpg"])]
    (tmp_path / "d.json").write_text(json.dumps({"images": images}))
    split = load_split({"name": "d", "format": "karpathy", "annotations": str(tmp_path / "d.json"),
                        "images": str(tmp_path / "img"), "captions_per_image": 1}, "test")
    with pytest.raises(XmrError) as e:
        extract_features(split, _bb("efficientnet_lite0", input_size=64), tmp_path / "f.h5", batch_size=1,
                         workers=1, progress=False)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'img' / 'broken.jpg'}: cannot read image") and "\n" not in msg
    assert not (tmp_path / "f.h5").exists()


def test_roi_align_with_detector_boxes_keeps_min_to_max_boxes_inside_the_image(photos, tmp_path):
    """boxes: detector (torchvision Faster R-CNN, random init here: no weights can be downloaded), keep-aspect
    resize: every image gets min_boxes..max_boxes regions, stored in original pixels inside the photo."""
    cfg = _bb("roi_align", trunk="resnet18", roi_head="c5", boxes="detector", allow_random_init=True, min_boxes=2,
              max_boxes=4, conf_thresh=0.5, input_size=96, max_size=160, resize="shorter_side")
    ff = FeatureFile(extract_features(photos[0], cfg, tmp_path / "d.h5", batch_size=2, workers=0, progress=False))
    assert ff.feature_dim == 512 and all(2 <= n <= 4 for n in ff.num_regions)
    boxes = ff.boxes()
    for i, n in enumerate(ff.num_regions):
        b = boxes[i, :n]
        assert (b[:, 0] >= 0).all() and (b[:, 2] <= 640 + 1e-3).all() and (b[:, 3] <= 427 + 1e-3).all()
        assert (b[:, 2] >= b[:, 0]).all() and (b[:, 3] >= b[:, 1]).all()
    assert ff.attrs["weights_sha256"] == "random-init+random-init" and ff.attrs["resize"] == "shorter_side"


def test_a_precomputed_only_backbone_is_refused_naming_its_import_command(tmp_path):
    """VSE++'s released VGG19 vectors have no extractor: `xmr extract` stops before reading the dataset (none is
    there), with one line giving config/backbones.yaml's import_command for this dataset, split and --out, and
    writes nothing; the workflow runs that command (rule import_precomputed) instead."""
    from tests.conftest import run_xmr

    out = tmp_path / "features" / "coco" / "vsepp_vgg19_precomp" / "test.h5"
    r = run_xmr("extract", "--dataset", "coco", "--backbone", "vsepp_vgg19_precomp", "--split", "test",
                "--out", out, "--config-dir", REPO / "config", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "xmr extract: error: backbone vsepp_vgg19_precomp: these features were precomputed by the authors and "
        "cannot be extracted here; import them: xmr import-features --format scan --pooled --src "
        f"data/coco/vsepp_precomp --dataset coco --split test --out {out}")
    assert not any(tmp_path.rglob("*.h5*"))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_extract_decodes_in_one_worker_fewer_than_the_cpus_it_may_use(tmp_path):
    """`xmr extract` without --workers, as a SLURM job or `taskset` confines it: on one CPU it decodes in its main
    process (0 workers), on two CPUs in 1 worker; it says so in its first line. A negative count is refused."""
    import subprocess
    import sys

    from tests.conftest import run_xmr, tiny_extraction_config, xmr_env

    cfg_dir = tiny_extraction_config(tmp_path, 1, input_size=64, batch_size=1)
    cpus = sorted(os.sched_getaffinity(0))
    cmd = [sys.executable, "-m", "xmr", "extract", "--dataset", "synth", "--backbone", "eff", "--split", "val",
           "--config-dir", str(cfg_dir), "--no-progress"]
    for n, line in [(1, "0 decoding workers"), (2, "1 decoding worker")][: len(cpus)]:
        r = subprocess.run(cmd + ["--out", str(tmp_path / f"{n}.h5")], env=xmr_env(), capture_output=True,
                           text=True, timeout=300, preexec_fn=lambda n=n: os.sched_setaffinity(0, cpus[:n]))
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines()[0] == f"extract synth/val: 1 image, {line}"
        assert (tmp_path / f"{n}.h5").exists()
    r = run_xmr(*cmd[3:], "--out", tmp_path / "x.h5", "--workers", "-1")
    assert r.returncode == 2 and not (tmp_path / "x.h5").exists()
    assert r.stderr.strip() == ("xmr extract: error: --workers -1: give 0 (decode in the main process) or more "
                                "worker processes")


def test_efficientnet_extraction_copy_folds_batch_norms_and_keeps_the_function(photos):
    # EfficientNetLite0.for_extraction folds each of the 49 batch norms (stem, head, 2 in the first block, 3 in each
    # of the other 15) into its convolution and lets the 12 stride-1 depthwise convolutions pad themselves; the 5
    # stride-2 ones (stem and 4 downsampling blocks) keep TensorFlow's asymmetric padding. Same features.
    from torch import nn

    split, _ = photos
    net = build_backbone({"name": "efficientnet_lite0"})
    fast = net.for_extraction()

    def count(m, kind):
        return sum(isinstance(x, kind) for x in m.modules())

    assert (count(net, nn.BatchNorm2d), count(net, nn.ZeroPad2d)) == (49, 17)  # the original is untouched
    assert (count(fast, nn.BatchNorm2d), count(fast, nn.ZeroPad2d)) == (0, 5)
    # its 17 ReLU6 (the stem's and head's, one per block) act in place; the original's do not
    assert [m.inplace for m in fast.modules() if isinstance(m, nn.ReLU6)] == [True] * 17
    assert [m.inplace for m in net.modules() if isinstance(m, nn.ReLU6)] == [False] * 17
    assert fast.weights_sha256 == net.weights_sha256
    assert fast.for_extraction() is fast and net.for_extraction() is not net  # folded once: a copy is kept as is
    from PIL import Image

    x = torch.stack([torch.from_numpy(np.asarray(Image.open(p).convert("RGB").resize((128, 128)), dtype=np.float32))
                     .permute(2, 0, 1) / 127.5 - 1 for p in split.image_paths])
    with torch.inference_mode():
        want, got = net(x)[0], fast(x)[0]
    assert want.shape == got.shape == (2, 16, 1280)
    assert float((got - want).norm() / want.norm()) < 1e-5
