"""End-to-end training from images (VSE∞ "grid mode"): a grid backbone fine-tuned inside the model.

``features.source: images`` makes the trainer read the split's image files (decoded and resized exactly as
``xmr extract`` does: :func:`xmr.features.decode.read_image`) instead of ``features/*.h5``. The backbone sits
in the model as ``model.image_backbone`` (a :class:`FinetunedBackbone`) and turns uint8 pixels into the same
``(B, R, F)`` local features + ``num_regions`` that precomputed features give, so every method trains end to
end unchanged. Its weights are part of the model's state_dict (checkpoints, ``xmr score``).

The recipe of VSE∞'s released code (woodfrog/vse_infty, ``train.py``/``lib/vse.py``/``lib/modules/resnet.py``,
``train_grid.sh``), one option each:

- ``optim.image_backbone_lr_scale`` (``--backbone_lr_factor 0.01``): the backbone's optimizer group runs at
  ``lr * scale``, in every phase of the lr schedule;
- ``image_backbone.frozen_epochs`` (``--embedding_warmup_epochs 1``): the backbone is frozen for the first N
  epochs (eval mode, no gradients: its weights and BN statistics stay exactly the pretrained ones), then trained;
- ``image_backbone.unfreeze_loss_ramp`` (``warmup_alpha``): in the first trained-backbone epoch the loss is
  scaled by step / steps-per-epoch, a linear warm-up of the whole model after unfreezing;
- ``image_backbone.freeze_bn`` (``ResnetFeatureExtractor.train``): BatchNorm layers stay in eval mode, so their
  running statistics are never updated (their affine weights still train);
- ``image_backbone.crop_scale`` / ``hflip`` (``RawImageDataset._process_image``): training images are randomly
  cropped to a U(lo, hi) fraction of each side, then resized, then flipped with probability ``hflip``;
- ``image_backbone.input_size`` (``--input_scale_factor 2.0``: 512 px): overrides the backbone config's size.

Not implemented: the released code's block-wise unfreezing over ``backbone_warmup_epochs`` (``train_grid.sh`` sets
it to 0, which unfreezes the whole network at once, as here).
"""

from __future__ import annotations

import torch
from torch import nn

from xmr.errors import XmrError
from xmr.features.backbones import BACKBONES, Backbone, build_backbone
from xmr.features.extract import input_settings, normalise
from xmr.run_inputs import is_end_to_end  # noqa: F401 - decided once, in xmr.run_inputs; imported from here too

IMAGE_SOURCES = ("precomputed", "images")


def _backbone_class(cfg: dict, src: str):
    from xmr.registry import import_submodules

    key = cfg.get("features", {}).get("backbone")
    if not key or "backbone_cfg" not in cfg:
        raise XmrError(f"{src}: features.backbone: end-to-end training (features.source: images) needs a backbone "
                       f"key of config/backbones.yaml (e.g. efficientnet_lite0, resnext101_wsl_512)")
    import_submodules("xmr.features.backbones")
    name = cfg["backbone_cfg"]["name"]
    if name not in BACKBONES:
        raise XmrError(f"{src}: features.backbone: {key} names backbone {name!r}, which is not registered; "
                       f"choose one of {', '.join(BACKBONES.names())}")
    return BACKBONES.get(name)


def check_image_source(cfg: dict, src: str = "run config") -> None:
    """Checks beyond the schema for ``features.source: images`` (one-line errors naming the key)."""
    if not is_end_to_end(cfg):
        return
    cls = _backbone_class(cfg, src)
    key = cfg["features"]["backbone"]
    if getattr(cls, "supports_keep_aspect", False) or getattr(cls, "needs_boxes", False):
        raise XmrError(f"{src}: features.backbone: {key} is a region backbone; end-to-end training needs a grid "
                       f"backbone (efficientnet_lite0, resnet50, resnet152, resnext101_32x8d); precompute region "
                       f"features with `xmr extract` and use features.source: precomputed")
    _, resize, _ = input_settings(image_backbone_config(cfg), cls)
    if resize == "shorter_side":
        raise XmrError(f"{src}: config/backbones.yaml:{key}: resize shorter_side; end-to-end training batches "
                       f"same-size images: use squash or center_crop")
    ib = cfg["image_backbone"]
    if ib["crop_scale"] is not None and ib["crop_scale"][0] > ib["crop_scale"][1]:
        raise XmrError(f"{src}: image_backbone.crop_scale: {ib['crop_scale']}: expected [low, high] with "
                       f"low <= high (VSE∞: [0.6, 1.0])")


def image_backbone_config(cfg: dict, pretrained: bool = True) -> dict:
    """The backbone config of an end-to-end run: ``backbone_cfg`` with ``image_backbone.input_size`` applied.
    ``pretrained=False`` skips loading the pretrained file (the weights then come from a run's checkpoint)."""
    bcfg = dict(cfg["backbone_cfg"])
    if cfg.get("image_backbone", {}).get("input_size"):
        bcfg["input_size"] = cfg["image_backbone"]["input_size"]
    if not pretrained and bcfg.get("weights"):
        bcfg["weights"], bcfg["allow_random_init"] = None, True
    return bcfg


def image_input_settings(cfg: dict) -> tuple[int, str, int | None]:
    """(input_size, resize mode, max_size) the images of an end-to-end run are prepared with."""
    return input_settings(image_backbone_config(cfg), _backbone_class(cfg, "run config"))


def _is_batchnorm(m: nn.Module) -> bool:
    return isinstance(m, nn.modules.batchnorm._BatchNorm)


class FinetunedBackbone(nn.Module):
    """uint8 images (B, 3, H, W) -> ``(local features (B, R, F), num_regions (B,))`` through a trainable backbone.

    ``frozen`` (set per epoch by the trainer): eval mode and no autograd graph, so the weights get no gradient
    (optimizers skip them) and BN statistics stay put. ``freeze_bn``: BatchNorm layers stay in eval mode while
    the rest trains.
    """

    def __init__(self, net: Backbone, freeze_bn: bool = True, max_regions: int | None = None) -> None:
        super().__init__()
        self.net = net
        self.freeze_bn, self.max_regions = freeze_bn, max_regions
        self.feature_dim = net.feature_dim
        self.frozen = False

    def set_frozen(self, frozen: bool) -> None:
        self.frozen = frozen
        self.train(self.training)

    def train(self, mode: bool = True) -> "FinetunedBackbone":
        super().train(mode)
        if mode and self.frozen:
            self.net.eval()
        elif mode and self.freeze_bn:
            for m in self.net.modules():
                if _is_batchnorm(m):
                    m.eval()
        return self

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = normalise(images, self.net.mean, self.net.std)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            feats = self.net(x)[0]
        if self.max_regions is not None:
            feats = feats[:, : self.max_regions]
        return feats, torch.full((len(feats),), feats.shape[1], dtype=torch.long, device=feats.device)


def build_image_backbone(cfg: dict, pretrained: bool = True) -> FinetunedBackbone:
    """The :class:`FinetunedBackbone` of an end-to-end run config (pretrained weights unless ``pretrained=False``)."""
    check_image_source(cfg)
    net = build_backbone(image_backbone_config(cfg, pretrained))
    return FinetunedBackbone(net, cfg["image_backbone"]["freeze_bn"], cfg["features"]["max_regions"])


def backbone_frozen(cfg: dict, epoch: int) -> bool:
    """Whether the backbone is frozen in (0-based) ``epoch``."""
    return epoch < cfg["image_backbone"]["frozen_epochs"]


def loss_scale(cfg: dict, epoch: int, step: int, steps_per_epoch: int) -> float:
    """VSE∞'s ``warmup_alpha``: step / steps in the first epoch after unfreezing (``unfreeze_loss_ramp``), else 1."""
    if not (is_end_to_end(cfg) and cfg["image_backbone"]["unfreeze_loss_ramp"]):
        return 1.0
    return step / max(1, steps_per_epoch) if epoch == cfg["image_backbone"]["frozen_epochs"] else 1.0
