"""Visual backbones for feature extraction (one module per family). Each entry builds a :class:`Backbone` from its config block.

A backbone maps a batch of normalised images (B, 3, H, W) to local features (B, R, F) plus optional boxes.
Weights always come from a local file (``weights:`` in config) or from a package that ships them; nothing is
downloaded at run time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from xmr.core.errors import XmrError
from xmr.core.registry import Registry, import_submodules

BACKBONES: Registry[Callable[[dict], "Backbone"]] = Registry("backbone")
#: a ResNet trunk's Sequential(conv1, bn1, relu, maxpool, layer1..layer4) indices of the modules with weights (the
#: torchvision and Caffe grids; checkpoint importers rename released keys by it)
TRUNK_INDEX = {"conv1": 0, "bn1": 1, "layer1": 4, "layer2": 5, "layer3": 6, "layer4": 7}


class Backbone(nn.Module):
    """Common interface: ``forward(images, boxes=None) -> (features (B,R,F), boxes (B,R,4) or None)``."""

    name: str = "backbone"
    feature_dim: int = 0
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    # pixels are divided by this before mean/std (255: means in 0-1 units; Caffe weights use 1)
    pixel_scale: float = 255.0
    weights_sha256: str = "random-init"
    needs_boxes: bool = False
    # convolution trunks run in NHWC during extraction: oneDNN's depthwise and 1x1 convolutions are ~2x faster
    # in it on 2 CPU threads (EfficientNet-Lite0 at 128 px: 5.5 vs 10.9 ms/img); features move by ~2e-5
    channels_last: bool = False

    def forward(self, images: torch.Tensor, boxes: list[torch.Tensor] | None = None):
        raise NotImplementedError

    def for_extraction(self) -> "Backbone":
        """The module extraction runs: this one, or a family's inference-only copy (batch norms folded into their
        convolutions, say) that computes the same function. Never changes ``self``: a fine-tuned backbone
        (:mod:`xmr.models.image_backbone`) keeps its batch norms."""
        return self


def read_weights(weights: str | os.PathLike, name: str, where_to_get: str) -> dict[str, torch.Tensor]:
    """A backbone's local weights file as a state dict (unwrapped from a ``state_dict``/``model`` container and
    DataParallel's ``module.`` prefix); a missing or unreadable file is one line naming it and ``where_to_get``."""
    path = Path(weights)
    if not path.is_file():
        raise XmrError(f"backbone {name}: weights file {path} not found; {where_to_get} and set "
                       f"backbones.<key>.weights to its path")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle errors, truncated downloads: one line naming the file
        raise XmrError(f"backbone {name}: cannot load weights {path} ({type(e).__name__}: {e}); re-download it, "
                       f"or convert it to a plain state_dict") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise XmrError(f"backbone {name}: {path} does not hold a state_dict")
    if state and all(k.startswith("module.") for k in state):  # saved from DataParallel/DDP
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def grid_to_regions(fmap: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) conv map -> (B, H*W, C) grid 'regions' in row-major order."""
    return fmap.flatten(2).transpose(1, 2)


def build_backbone(cfg: dict) -> Backbone:
    """Build the backbone named by ``cfg['name']`` in eval mode (one module per family in this package)."""
    import_submodules("xmr.features.backbones")
    return BACKBONES.get(cfg["name"])(cfg).eval()
