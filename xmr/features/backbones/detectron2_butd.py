"""Bottom-up-attention region features (Anderson et al. 2018): Faster R-CNN R101-C4 trained on Visual Genome,
run through detectron2 when it is installed.

Fixed 36 boxes (``min_boxes = max_boxes = 36``, the SCAN/VSE∞ "k36" features) or adaptive 10-100 boxes with
confidence >= 0.2 (the original captioning/VQA features), 2048-d each, plus boxes in original-image pixels.
Box selection follows bottom-up-attention's ``generate_tsv.py``: per-class NMS (IoU 0.3) over the proposals
for every object class, each proposal's confidence is its best class score among the classes where it
survived NMS, then the min/max/threshold rule. Features are the mean-pooled res5 output of the proposals.

detectron2 is not on PyPI; it is built from its GitHub source (docs/datasets.md "detectron2",
``envs/detectron2.yaml``). The BUTD Caffe-converted weights need a detectron2 config for the VG model: the
``configs/caffe/test-caffe-r101-fix36.yaml`` family of MILVLG/bottom-up-attention.pytorch, or
``configs/VG-Detection/faster_rcnn_R_101_C4_caffemaxpool.yaml`` of airsplay/py-bottom-up-attention, given as
``config_file:`` with ``weights:``. Images are resized keeping the aspect ratio (shorter side ``input_size``,
600 in BUTD; longer side at most ``max_size`` 1000) and fed as BGR 0-255 minus the config's pixel means.
"""

from __future__ import annotations

from pathlib import Path

import torch

from xmr.core.errors import XmrError
from xmr.core.io import sha256_file
from xmr.features.backbones import BACKBONES, Backbone

INSTALL_HINT = (
    "backbone butd_detectron2 needs detectron2, which is not on PyPI: create the environment in "
    "envs/detectron2.yaml, then `pip install --no-build-isolation "
    "'git+https://github.com/facebookresearch/detectron2.git'` (setuptools<81 for pkg_resources; see "
    "docs/datasets.md 'detectron2'), or use the installable `roi_align` backbone"
)


def butd_select(boxes: torch.Tensor, class_probs: torch.Tensor, min_boxes: int = 10, max_boxes: int = 100,
                conf_thresh: float = 0.2, nms_thresh: float = 0.3) -> torch.Tensor:
    """Indices of the proposals BUTD keeps.

    ``boxes`` (K, 4) proposals; ``class_probs`` (K, C+1) softmax scores with background in column 0.
    Per class c >= 1, NMS over (boxes, probs[:, c]); ``max_conf[k]`` = max of probs[k, c] over the classes
    whose NMS kept k. Keep ``max_conf >= conf_thresh`` (in proposal order); if fewer than ``min_boxes``, the
    ``min_boxes`` most confident; if more than ``max_boxes``, the ``max_boxes`` most confident.
    """
    from torchvision.ops import batched_nms

    k, c1 = class_probs.shape
    scores = class_probs[:, 1:]
    flat_scores = scores.reshape(-1)
    flat_boxes = boxes[:, None, :].expand(k, c1 - 1, 4).reshape(-1, 4)
    classes = torch.arange(c1 - 1, device=boxes.device).repeat(k)
    keep = batched_nms(flat_boxes.float(), flat_scores.float(), classes, nms_thresh)  # independent per class
    max_conf = torch.zeros(k, dtype=flat_scores.dtype, device=boxes.device)
    max_conf.scatter_reduce_(0, keep // (c1 - 1), flat_scores[keep], reduce="amax")
    above = torch.nonzero(max_conf >= conf_thresh).flatten()
    if min_boxes <= len(above) <= max_boxes:
        return above
    order = torch.argsort(max_conf, descending=True, stable=True)
    return order[: (min_boxes if len(above) < min_boxes else max_boxes)]


@BACKBONES.register("butd_detectron2")
class Detectron2BUTD(Backbone):
    name = "butd_detectron2"
    feature_dim = 2048
    mean = (0.0, 0.0, 0.0)  # the extractor hands over RGB in [0, 1]; BGR/255/pixel means are applied here
    std = (1.0, 1.0, 1.0)
    resize = "shorter_side"
    max_size = 1000
    supports_keep_aspect = True

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        try:
            from detectron2.checkpoint import DetectionCheckpointer
            from detectron2.config import get_cfg
            from detectron2.modeling import build_model
        except ImportError:
            raise XmrError(INSTALL_HINT) from None
        config_file, weights = cfg.get("config_file"), cfg.get("weights")
        for key, value in (("config_file", config_file), ("weights", weights)):
            if not value or not Path(value).exists():
                raise XmrError(f"backbone butd_detectron2: `{key}:` {value!r} is not an existing file; give the "
                               f"BUTD VG detectron2 config and the converted R101 weights (docs/datasets.md)")
        dcfg = get_cfg()
        dcfg.set_new_allowed(True)  # BUTD configs carry extra keys (attribute head, extractor settings)
        dcfg.merge_from_file(str(config_file))
        dcfg.MODEL.WEIGHTS = str(weights)
        dcfg.MODEL.DEVICE = "cpu"  # moved with .to(device) by the extractor
        self.model = build_model(dcfg).eval()
        DetectionCheckpointer(self.model).load(str(weights))
        if not hasattr(self.model.roi_heads, "_shared_roi_transform"):
            raise XmrError(f"backbone butd_detectron2: {config_file} does not build a C4 (Res5ROIHeads) model; "
                           f"BUTD features need the R101-C4 VG config")
        self.weights_sha256 = sha256_file(weights)
        self.min_boxes, self.max_boxes = int(cfg.get("min_boxes", 10)), int(cfg.get("max_boxes", 100))
        self.conf_thresh = float(cfg.get("conf_thresh", 0.2))
        self.needs_boxes = cfg.get("boxes") == "annotations"  # features of given boxes instead of detections

    def forward(self, images: torch.Tensor, boxes: list[torch.Tensor] | None = None,
                image_sizes: list[tuple[int, int]] | None = None):
        from detectron2.structures import Boxes, ImageList

        from xmr.features.backbones.roi_align import pad_regions

        m = self.model
        b, _, h, w = images.shape
        sizes = image_sizes or [(h, w)] * b
        x = images[:, [2, 1, 0]] * 255.0
        x = (x - m.pixel_mean) / m.pixel_std
        for i, (hh, ww) in enumerate(sizes):  # detectron2 pads after normalising, with zeros
            x[i, :, hh:, :] = 0
            x[i, :, :, ww:] = 0
        div = m.backbone.size_divisibility or 1
        ph, pw = -(-h // div) * div, -(-w // div) * div
        x = torch.nn.functional.pad(x, (0, pw - w, 0, ph - h))
        image_list = ImageList(x, [tuple(s) for s in sizes])
        feats = m.backbone(image_list.tensor)
        if boxes is None:
            proposals, _ = m.proposal_generator(image_list, feats, None)
            prop_boxes = [p.proposal_boxes for p in proposals]
        else:
            prop_boxes = [Boxes(bx.to(x.device, torch.float32).reshape(-1, 4)) for bx in boxes]
        roi = m.roi_heads
        pooled = roi._shared_roi_transform([feats[f] for f in roi.in_features], prop_boxes).mean(dim=(2, 3))
        counts = [len(pb) for pb in prop_boxes]
        chunks, kept = [], []
        if boxes is None:
            logits = roi.box_predictor(pooled)[0]
            probs = torch.softmax(logits, dim=-1)
            # detectron2 puts background last; BUTD's rule reads it in column 0
            probs = torch.cat([probs[:, -1:], probs[:, :-1]], dim=1)
            for f, p, pb in zip(pooled.split(counts), probs.split(counts), prop_boxes):
                keep = butd_select(pb.tensor, p, self.min_boxes, self.max_boxes, self.conf_thresh)
                chunks.append(f[keep])
                kept.append(pb.tensor[keep])
        else:
            chunks = list(pooled.split(counts))
            kept = [pb.tensor for pb in prop_boxes]
        return pad_regions(chunks, kept)
