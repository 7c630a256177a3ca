"""VGG19's fc7 vector via torchvision (VSE++'s full-image VGG19 encoder), weights from a local checkpoint file.

The image goes through ``features`` (the convolutions), ``avgpool`` (the identity at 224 px: torchvision's
VGG pools to 7 x 7, and the torch 0.3 VGG the released VSE++ models were trained with had no pooling there),
and the classifier without its last layer (fc6, ReLU, Dropout, fc7, ReLU, Dropout), as VSE++'s
``EncoderImageFull`` does: one 4096-d "region" per image. Checkpoints accepted: a torchvision ``state_dict``
(``vgg19-dcbb9e9d.pth``); its ``classifier.6.*`` (the ImageNet classes) is not needed.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from xmr.core.errors import XmrError
from xmr.core.io import sha256_file
from xmr.features.backbones import BACKBONES, Backbone, read_weights


@BACKBONES.register("vgg19")
class VGG19FC7(Backbone):
    """torchvision VGG19 up to fc7 (after its ReLU): (B, 1, 4096)."""

    feature_dim = 4096

    def __init__(self, cfg: dict) -> None:
        import torchvision

        super().__init__()
        self.name = "vgg19"
        net = torchvision.models.vgg19(weights=None)
        weights = cfg.get("weights")
        if weights:
            path = Path(weights)
            state = read_weights(path, "vgg19", "download torchvision's vgg19-dcbb9e9d.pth on a connected machine")
            missing, _ = net.load_state_dict(state, strict=False)
            bad = [k for k in missing if not k.startswith("classifier.6.")]
            if bad:
                raise XmrError(f"backbone vgg19: {path} is missing {len(bad)} weights (e.g. {bad[0]}); is it a "
                               f"torchvision vgg19 checkpoint?")
            self.weights_sha256 = sha256_file(path)
        elif not cfg.get("allow_random_init", False):
            raise XmrError("backbone vgg19: no `weights:` path configured; point it at a local checkpoint (or set "
                           "allow_random_init: true for tests)")
        self.features, self.avgpool = net.features, net.avgpool
        self.classifier = nn.Sequential(*list(net.classifier.children())[:-1])

    def forward(self, images, boxes=None):
        x = self.avgpool(self.features(images)).flatten(1)
        return self.classifier(x).unsqueeze(1), None
