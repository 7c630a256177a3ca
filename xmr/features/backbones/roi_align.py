"""Region features without detectron2: ``torchvision.ops.roi_align`` over a grid backbone's feature map.

Boxes come from the dataset (``boxes: annotations``; e.g. the synth set's ``objects[].box``, in pixels) or from
a torchvision Faster R-CNN with local weights (``boxes: detector``). Two heads (``roi_head``):

- ``res5`` (ResNet trunks; the BUTD R101-C4 head): RoIAlign 14x14 on the stride-16 C4 map, then ``layer4``,
  then the spatial mean -> 2048-d per box.
- ``c5``: RoIAlign 7x7 on the stride-32 final map, then the mean -> 2048-d (ResNet) / 1280-d
  (EfficientNet-Lite0, the trunk whose ImageNet weights install offline).

These are BUTD-*style* features (boxes x 2048 plus boxes), not numerically the Visual Genome BUTD features:
the trunk is ImageNet-trained and boxes are not VG detections. Use ``butd_detectron2`` for those.
Boxes are taken and returned in the coordinates of the network input; the extractor converts to and from
original-image pixels. An image without boxes gets one whole-image box, so no image has an empty set.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from xmr.core.errors import XmrError
from xmr.core.io import sha256_file
from xmr.features.backbones import BACKBONES, Backbone


def select_detections(scores: torch.Tensor, min_boxes: int, max_boxes: int, conf_thresh: float) -> torch.Tensor:
    """Indices of the kept detections, best first: every one scoring >= ``conf_thresh``, but at least
    ``min_boxes`` and at most ``max_boxes`` (the BUTD 10-100 rule; fixed 36 is min = max = 36)."""
    order = torch.argsort(scores, descending=True, stable=True)
    k = int((scores >= conf_thresh).sum())
    k = max(min_boxes, min(max_boxes, k))
    return order[: min(k, len(order))]


def pad_regions(chunks: list[torch.Tensor], boxes: list[torch.Tensor]):
    """Per-image (K_i, F) features and (K_i, 4) boxes -> zero-padded (B, K, F), (B, K, 4) and counts (B,)."""
    counts = torch.tensor([len(c) for c in chunks])
    k = int(counts.max()) if len(chunks) else 0
    feat_dim = chunks[0].shape[1]
    feats = chunks[0].new_zeros(len(chunks), k, feat_dim)
    out_boxes = chunks[0].new_zeros(len(chunks), k, 4)
    for i, (c, b) in enumerate(zip(chunks, boxes)):
        feats[i, : len(c)] = c
        out_boxes[i, : len(b)] = b
    return feats, out_boxes, counts


@BACKBONES.register("roi_align")
class RoIAlignRegions(Backbone):
    """Region features by RoIAlign on a grid trunk (see module docstring); config keys: ``trunk``,
    ``weights`` (trunk), ``roi_head`` (res5 | c5), ``boxes`` (annotations | detector), ``detector_weights``,
    ``min_boxes``/``max_boxes``/``conf_thresh`` (detector boxes), ``max_boxes`` (caps given boxes too)."""

    name = "roi_align"
    supports_keep_aspect = True

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        trunk = cfg.get("trunk")
        if not trunk:
            raise XmrError("backbone roi_align: set `trunk:` (efficientnet_lite0 or a torchvision ResNet, e.g. "
                           "resnet101) in config/backbones.yaml")
        self.box_source = cfg["boxes"] or "annotations"
        if self.box_source not in ("annotations", "detector"):
            raise XmrError(f"backbone roi_align: boxes: {self.box_source!r}; use `annotations` (the dataset's "
                           f"per-image boxes) or `detector` (torchvision Faster R-CNN)")
        self.needs_boxes = self.box_source == "annotations"
        self.min_boxes = int(cfg["min_boxes"])
        self.max_boxes = int(cfg["max_boxes"])
        self.conf_thresh = float(cfg["conf_thresh"])
        if trunk == "efficientnet_lite0":
            from xmr.features.backbones.efficientnet import EfficientNetLite0

            eff = EfficientNetLite0({"weights": cfg.get("weights")})
            self.mean, self.std = eff.mean, eff.std
            self.c5 = eff.net.extract_features
            self._eff = eff  # registers the parameters (``.to(device)`` moves them)
            self.feature_dim, self.weights_sha256 = eff.feature_dim, eff.weights_sha256
            self.roi_head = cfg.get("roi_head") or "c5"
            if self.roi_head != "c5":
                raise XmrError("backbone roi_align: trunk efficientnet_lite0 supports only roi_head: c5")
        else:
            from xmr.features.backbones.torchvision_grid import resnet_stages, torchvision_resnet

            net, self.weights_sha256 = torchvision_resnet(trunk, cfg)
            self.c4, self.res5 = resnet_stages(net)
            self.c5 = nn.Sequential(self.c4, self.res5)
            self.feature_dim = net.fc.in_features
            self.roi_head = cfg.get("roi_head") or "res5"
            if self.roi_head not in ("res5", "c5"):
                raise XmrError(f"backbone roi_align: roi_head: {self.roi_head!r}; use res5 (BUTD C4 head) or c5")
        self.detector = self._build_detector(cfg) if self.box_source == "detector" else None
        if self.detector is not None:
            self.weights_sha256 += "+" + self._detector_sha

    def _build_detector(self, cfg: dict) -> nn.Module:
        from torchvision.models.detection import fasterrcnn_resnet50_fpn

        size = int(cfg.get("input_size", 224))
        # box_score_thresh 0 / many detections: the min/max/conf rule below does the selection
        det = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, min_size=size, max_size=max(size, 1333),
                                      box_score_thresh=0.0, box_detections_per_img=max(300, self.max_boxes))
        path = cfg.get("detector_weights")
        self._detector_sha = "random-init"
        if path:
            if not Path(path).exists():
                raise XmrError(f"backbone roi_align: detector_weights {path} not found; save torchvision's "
                               f"fasterrcnn_resnet50_fpn COCO weights on a connected machine and point to the file")
            state = torch.load(path, map_location="cpu", weights_only=True)
            try:
                det.load_state_dict(state.get("model", state) if isinstance(state, dict) else state)
            except RuntimeError as e:
                raise XmrError(f"backbone roi_align: {path} is not a fasterrcnn_resnet50_fpn state_dict "
                               f"({str(e).splitlines()[0]})") from None
            self._detector_sha = sha256_file(path)
        elif not cfg.get("allow_random_init", False):
            raise XmrError("backbone roi_align: boxes: detector needs `detector_weights:` (a local "
                           "fasterrcnn_resnet50_fpn checkpoint), or allow_random_init: true for tests")
        return det.eval()

    def _detect(self, images: torch.Tensor, image_sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
        mean = torch.tensor(self.mean, device=images.device).view(3, 1, 1)
        std = torch.tensor(self.std, device=images.device).view(3, 1, 1)
        raw = [(img * std + mean)[:, :h, :w] for img, (h, w) in zip(images, image_sizes)]  # the detector's [0,1]
        out = []
        for det in self.detector(raw):
            keep = select_detections(det["scores"], self.min_boxes, self.max_boxes, self.conf_thresh)
            out.append(det["boxes"][keep])
        return out

    def forward(self, images: torch.Tensor, boxes: list[torch.Tensor] | None = None,
                image_sizes: list[tuple[int, int]] | None = None):
        from torchvision.ops import roi_align

        b, _, h, w = images.shape
        sizes = image_sizes or [(h, w)] * b
        if boxes is None:
            if self.detector is None:
                raise XmrError("backbone roi_align: boxes: annotations but no boxes were passed")
            boxes = self._detect(images, sizes)
        kept = []
        for bx, (hh, ww) in zip(boxes, sizes):
            bx = bx.to(images.device, torch.float32).reshape(-1, 4)[: self.max_boxes]
            if len(bx) == 0:
                bx = torch.tensor([[0.0, 0.0, ww, hh]], device=images.device)
            bx = torch.stack([bx[:, 0].clamp(0, ww), bx[:, 1].clamp(0, hh), bx[:, 2].clamp(0, ww),
                              bx[:, 3].clamp(0, hh)], dim=1)
            kept.append(bx)
        if self.roi_head == "res5":
            fmap = self.c4(images)
            pooled = roi_align(fmap, kept, output_size=14, spatial_scale=1 / 16, sampling_ratio=0, aligned=True)
            flat = self.res5(pooled).mean(dim=(2, 3))
        else:
            fmap = self.c5(images)
            pooled = roi_align(fmap, kept, output_size=7, spatial_scale=1 / 32, sampling_ratio=0, aligned=True)
            flat = pooled.mean(dim=(2, 3))
        chunks = list(flat.split([len(k) for k in kept]))
        return pad_regions(chunks, kept)
