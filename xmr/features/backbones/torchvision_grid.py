"""ResNet / ResNeXt C5 grid features via torchvision, weights from a local checkpoint file."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from xmr.errors import XmrError
from xmr.features.backbones import BACKBONES, Backbone, grid_to_regions
from xmr.io import sha256_file


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
