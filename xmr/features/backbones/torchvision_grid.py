"""ResNet / ResNeXt C5 grid features via torchvision, weights from a local checkpoint file.

Checkpoints accepted: a torchvision ``state_dict`` (``resnet152-f82ba261.pth``), the torch.hub WSL-Images
ResNeXt files (``ig_resnext101_32x8-c38310e5.pth``), timm ResNet/ResNeXt weights (same key names), and
training checkpoints that wrap the state under ``state_dict``/``model`` or prefix keys with ``module.``.
The classifier (``fc.*``) is not needed and may be absent. Grid size = input_size / 32 (7x7 at 224 px,
16x16 at 512 px, the VSE∞ WSL setting).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from xmr.core.errors import XmrError
from xmr.core.io import sha256_file
from xmr.features.backbones import BACKBONES, Backbone, grid_to_regions, read_weights

#: torchvision architectures with the conv1/bn1/layer1..layer4 trunk that these backbones cut at C4/C5.
RESNET_ARCHS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
                "resnext101_32x8d", "resnext101_64x4d")


def torchvision_resnet(arch: str, cfg: dict) -> tuple[nn.Module, str]:
    """A torchvision ResNet/ResNeXt with weights from ``cfg['weights']`` (local file) -> (net, sha256)."""
    import torchvision

    if arch not in RESNET_ARCHS:
        raise XmrError(f"backbone trunk {arch!r}: not a torchvision ResNet/ResNeXt; choose one of "
                       f"{', '.join(RESNET_ARCHS)}")
    net = getattr(torchvision.models, arch)(weights=None)
    weights = cfg.get("weights")
    digest = "random-init"
    if weights:
        path = Path(weights)
        state = read_weights(path, arch, "download the torchvision/timm checkpoint on a connected machine")
        missing, _unexpected = net.load_state_dict(state, strict=False)
        bad = [k for k in missing if not k.startswith("fc.")]
        if bad:
            raise XmrError(f"backbone {arch}: {path} is missing {len(bad)} weights (e.g. {bad[0]}); "
                           f"is it a torchvision {arch} checkpoint?")
        digest = sha256_file(path)
    elif not cfg.get("allow_random_init", False):
        raise XmrError(f"backbone {arch}: no `weights:` path configured; point it at a local checkpoint "
                       f"(or set allow_random_init: true for tests)")
    return net, digest


def resnet_stages(net: nn.Module) -> tuple[nn.Sequential, nn.Module]:
    """(C4 trunk: stem + layer1..layer3 at stride 16, res5 = layer4) of a torchvision ResNet."""
    c4 = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3)
    return c4, net.layer4


class TorchvisionGrid(Backbone):
    """ResNet/ResNeXt C5 grid (2048-d for ResNet-50 and deeper)."""

    arch = ""
    feature_dim = 2048
    channels_last = True

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.name = self.arch
        net, self.weights_sha256 = torchvision_resnet(self.arch, cfg)
        c4, res5 = resnet_stages(net)
        self.trunk = nn.Sequential(*c4, res5)
        self.feature_dim = net.fc.in_features

    def forward(self, images, boxes=None):
        return grid_to_regions(self.trunk(images)), None


for _arch in ("resnet50", "resnet152", "resnext101_32x8d"):
    BACKBONES.register(_arch)(type(f"Grid_{_arch}", (TorchvisionGrid,), {"arch": _arch}))
