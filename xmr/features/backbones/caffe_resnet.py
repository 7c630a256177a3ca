"""Caffe-style ResNet-101 grid features: the bottom-up-attention (BUTD) detector's backbone, as VSE∞'s grid models
run it (woodfrog/vse_infty ``lib/modules/resnet.py``, ``backbone_source detector``).

It differs from torchvision's ResNet in three places, all from the Caffe original:

- each bottleneck strides on its first 1x1 convolution (torchvision: on the 3x3);
- the stem's max-pool has padding 0 and ``ceil_mode=True`` (torchvision: padding 1, floor);
- the input is BGR, 0-255, minus the Caffe pixel means ``[102.9801, 115.9465, 122.7717]`` (B, G, R), no std.

The layout is torchvision's (``conv1 bn1 layer1..layer4``, ``downsample.0/1``), so weights load by name; the
C5 map is flattened to (B, H*W, 2048) grid vectors: 16 x 16 at VSE∞'s 512 x 512 input. ``weights:`` is a local
file: the reference's ``original_updown_backbone.pth`` (``{'base': ..., 'top': ...}``, the two Sequentials of its
``ResnetFeatureExtractor``) or a state dict with the ResNet's own names.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from xmr.core.errors import XmrError
from xmr.core.io import sha256_file
from xmr.features.backbones import BACKBONES, TRUNK_INDEX, Backbone, grid_to_regions, read_weights

#: blocks per stage
CAFFE_RESNET_LAYERS = {"caffe_resnet101": (3, 4, 23, 3)}
#: Caffe BGR pixel means in RGB order (normalise subtracts them per RGB channel; the forward then reverses channels)
CAFFE_PIXEL_MEANS_RGB = (122.7717, 115.9465, 102.9801)


class CaffeBottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False)  # Caffe: stride here
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


def caffe_resnet_trunk(layers: tuple[int, ...]) -> nn.Sequential:
    """Sequential(conv1, bn1, relu, maxpool, layer1..layer4) of a Caffe-style ResNet with ``layers`` blocks."""
    stem = [nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
            nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=3, stride=2, padding=0, ceil_mode=True)]
    stages, inplanes = [], 64
    for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
        stride = 1 if i == 0 else 2
        downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, kernel_size=1, stride=stride, bias=False),
                                   nn.BatchNorm2d(planes * 4))
        stage = [CaffeBottleneck(inplanes, planes, stride, downsample)]
        inplanes = planes * 4
        stage += [CaffeBottleneck(inplanes, planes) for _ in range(1, blocks)]
        stages.append(nn.Sequential(*stage))
    return nn.Sequential(*stem, *stages)


def trunk_state(state: dict[str, torch.Tensor], src: object) -> dict[str, torch.Tensor]:
    """A Caffe ResNet's weights under the trunk's names: from ``{'base', 'top'}`` (the reference's backbone file:
    base = Sequential(conv1, bn1, relu, maxpool, layer1..3), top = Sequential(layer4)) or from ResNet names
    (``conv1.``, ``layer4.`` ...; a ``fc.`` classifier is ignored)."""
    if isinstance(state.get("base"), dict) and isinstance(state.get("top"), dict):
        out = dict(state["base"])
        out.update({f"7.{k.split('.', 1)[1]}": v for k, v in state["top"].items()})
        return out
    out = {}
    for key, value in state.items():
        head, _, rest = key.removeprefix("module.").partition(".")
        if head in TRUNK_INDEX:
            out[f"{TRUNK_INDEX[head]}.{rest}"] = value
        elif head != "fc":
            raise XmrError(f"{src}: unexpected key {key} for a Caffe ResNet backbone")
    return out


@BACKBONES.register("caffe_resnet101")
class CaffeResNetGrid(Backbone):
    """Caffe-style ResNet-101 C5 grid, 2048-d (the BUTD detector's backbone)."""

    name = "caffe_resnet101"
    feature_dim = 2048
    mean = CAFFE_PIXEL_MEANS_RGB
    std = (1.0, 1.0, 1.0)
    pixel_scale = 1.0

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.trunk = caffe_resnet_trunk(CAFFE_RESNET_LAYERS[self.name])
        weights = cfg.get("weights")
        if weights:
            path = Path(weights)
            state = read_weights(path, self.name, "download VSE∞'s original_updown_backbone.pth (its README)")
            missing, unexpected = self.trunk.load_state_dict(trunk_state(state, path), strict=False)
            missing = [k for k in missing if not k.endswith("num_batches_tracked")]  # older files lack it
            if missing or unexpected:
                raise XmrError(f"backbone {self.name}: {path} does not fit a Caffe ResNet-101 "
                               f"({len(missing)} missing keys, e.g. {(missing or unexpected)[0]})")
            self.weights_sha256 = sha256_file(path)
        elif not cfg.get("allow_random_init", False):
            raise XmrError(f"backbone {self.name}: no `weights:` path configured; point it at a local "
                           f"original_updown_backbone.pth (or set allow_random_init: true for tests)")

    def forward(self, images: torch.Tensor, boxes=None):
        # normalise() subtracted the means per RGB channel; Caffe weights read BGR
        return grid_to_regions(self.trunk(images.flip(1))), None
