"""End-to-end training from images (VSE∞ "grid mode"): a grid backbone fine-tuned inside the model.

``features.source: images`` (:class:`xmr.settings.run_settings.ImageInput`, whose
:func:`~xmr.settings.run_settings.image_preparation` decides and checks the input) makes the trainer read the split's
image files (decoded and resized exactly as ``xmr extract`` does: :func:`xmr.features.decode.read_image`) instead of
``features/*.h5``. The backbone sits in the model as ``model.image_backbone`` (a :class:`FinetunedBackbone`) and
turns uint8 pixels into the same ``(B, R, F)`` local features + ``num_regions`` that precomputed features give, so
every method trains end to end unchanged. Its weights are part of the model's state_dict (checkpoints, ``xmr score``).

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

from xmr.features.backbones import BACKBONES, Backbone, build_backbone
from xmr.features.extract import normalise
from xmr.settings.run_settings import ImageInput


def _is_batchnorm(m: nn.Module) -> bool:
    return isinstance(m, nn.modules.batchnorm._BatchNorm)


class FinetunedBackbone(nn.Module):
    """0-255 images (B, 3, H, W) -> ``(local features (B, R, F), num_regions (B,))`` through a trainable backbone
    (uint8; float32 after ``resize: squash_inter_linear``).

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
        x = normalise(images, self.net.mean, self.net.std, pixel_scale=self.net.pixel_scale)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            feats = self.net(x)[0]
        if self.max_regions is not None:
            feats = feats[:, : self.max_regions]
        return feats, torch.full((len(feats),), feats.shape[1], dtype=torch.long, device=feats.device)


def build_image_backbone(image: ImageInput, pretrained: bool = True) -> FinetunedBackbone:
    """The :class:`FinetunedBackbone` of an end-to-end run's image input (its backbone entry as
    :attr:`ImageInput.preparation` resolved it; pretrained weights unless ``pretrained=False``, which skips loading
    the pretrained file: the weights then come from a run's checkpoint)."""
    bcfg = dict(image.preparation.backbone_config)
    if not pretrained and bcfg.get("weights"):
        bcfg["allow_random_init"] = True
        if not getattr(BACKBONES.get(bcfg["name"]), "config_in_weights", False):  # a folder keeps its config.json
            bcfg["weights"] = None
    return FinetunedBackbone(build_backbone(bcfg), image.freeze_bn, image.max_regions)
