"""Patch tokens of a ``transformers`` vision tower saved with ``save_pretrained`` in a local folder: one family for
ViT (``ViTModel``), CLIP (``CLIPModel``, ``CLIPVisionModel``), SigLIP (``SiglipModel``, ``SiglipVisionModel``) and
DINOv2 (``Dinov2Model``), loaded through ``AutoModel`` (a dual encoder's image tower is its ``vision_model``).

The "regions" of the feature store are the tower's output tokens (``last_hidden_state``, or ``hidden_states[layer]``
with ``layer:``): the class token first (``class_token: true``, the default; CLIP's zero-shot head reads it), then
the patches in row-major order (14 x 14 = 196 at 224 px with patch 16). SigLIP has no class token.

Preprocessing comes from the folder's ``preprocessor_config.json`` (the image processor saved beside the model):
``size`` / ``crop_size`` give the input size and resize mode (``{height, width}``: the whole image squashed to the
square, ViT and SigLIP; ``shortest_edge`` + ``crop_size``: shorter side then the central square, CLIP and DINOv2),
``image_mean`` / ``image_std`` / ``rescale_factor`` the normalisation. xmr resizes with its own bilinear filter
(:mod:`xmr.features.decode`, the same for every backbone), whatever the processor's ``resample`` says.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from xmr.core.errors import XmrError
from xmr.features.backbones import BACKBONES, Backbone
from xmr.features.decode import CROP_RATIO

PROCESSOR_FILE = "preprocessor_config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def model_folder(cfg: dict) -> Path:
    """The ``weights:`` folder of a transformers backbone entry; a missing or wrong folder is one line naming it."""
    key = cfg.get("key", cfg["name"])
    if not cfg.get("weights"):
        raise XmrError(f"backbone {key}: no `weights:` folder; set it to a local folder written by save_pretrained "
                       f"(config.json, model.safetensors, {PROCESSOR_FILE})")
    path = Path(cfg["weights"])
    if not (path / "config.json").is_file():
        raise XmrError(f"backbone {key}: {path} is not a transformers model folder (no config.json); save the model "
                       f"and its image processor there with save_pretrained, or fix `weights:` in backbones.yaml")
    return path


def processor_settings(cfg: dict) -> dict:
    """``input_size``, ``resize``, ``mean``, ``std``, ``pixel_scale`` from the folder's saved image processor."""
    path = model_folder(cfg) / PROCESSOR_FILE
    if not path.is_file():
        raise XmrError(f"backbone {cfg.get('key', cfg['name'])}: {path} not found; save the model's image "
                       f"processor beside it (AutoImageProcessor.from_pretrained(...).save_pretrained(folder))")
    try:
        proc = json.loads(path.read_text())
    except ValueError as e:
        raise XmrError(f"{path}: not JSON ({e})") from None
    size, crop = proc.get("size") or {}, proc.get("crop_size") or {}
    if isinstance(size, int):
        size = {"shortest_edge": size}
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    if proc.get("do_center_crop") and "shortest_edge" in size:
        side = int(crop.get("height") or crop.get("width") or size["shortest_edge"])
        ratio = side / int(size["shortest_edge"])
        if abs(ratio - 1) < 1e-6:
            resize = "shorter_side_center_crop"
        elif round(side / CROP_RATIO) == int(size["shortest_edge"]):  # xmr's center_crop (224 of 256)
            resize = "center_crop"
        else:
            raise XmrError(f"{path}: crop {side} of a {size['shortest_edge']} px shorter side; xmr crops the full "
                           f"shorter side or {CROP_RATIO} of it: set crop_size or size to one of those")
    elif "height" in size:
        if size["height"] != size.get("width", size["height"]):
            raise XmrError(f"{path}: size {size}: xmr feeds square images; make height and width equal")
        side, resize = int(size["height"]), "squash"
    elif "shortest_edge" in size:
        side, resize = int(size["shortest_edge"]), "shorter_side_center_crop"
    else:
        raise XmrError(f"{path}: size {size!r}: expected {{height, width}} or {{shortest_edge}} (and crop_size)")
    scale = float(proc.get("rescale_factor", 1 / 255)) if proc.get("do_rescale", True) else 1.0
    normalize = proc.get("do_normalize", True)
    return {"input_size": side, "resize": resize, "pixel_scale": 1.0 / scale,
            "mean": tuple(proc.get("image_mean", (0.0,) * 3)) if normalize else (0.0,) * 3,
            "std": tuple(proc.get("image_std", (1.0,) * 3)) if normalize else (1.0,) * 3}


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The image tower of a loaded model: a dual encoder's ``vision_model``, else the model itself."""
    return getattr(model, "vision_model", model)


def load_pretrained(cfg: dict, architecture_only: bool = False) -> torch.nn.Module:
    """``AutoModel`` of the entry's folder (random weights of its config.json when ``architecture_only``)."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging

    logging.disable_progress_bar()  # xmr's own bars and log lines only
    path = model_folder(cfg)
    try:
        if architecture_only:
            return AutoModel.from_config(AutoConfig.from_pretrained(path))
        return AutoModel.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise XmrError(f"backbone {cfg.get('key', cfg['name'])}: cannot load {path} with transformers "
                       f"({type(e).__name__}: {str(e).splitlines()[0]})") from None


def weights_digest(path: Path) -> str:
    from xmr.core.io import sha256_file

    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return sha256_file(path / name)
    return "random-init"


@BACKBONES.register("transformers")
class TransformersVision(Backbone):
    """A transformers vision tower's output tokens ``(B, 1 + P, hidden)`` (class token first unless dropped)."""

    #: the ``weights:`` folder also holds the architecture (config.json): a checkpoint reload keeps it
    config_in_weights = True

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        folder = model_folder(cfg)
        self.name = f"transformers:{folder.name}"
        pre = processor_settings(cfg)
        self.mean, self.std, self.pixel_scale = pre["mean"], pre["std"], pre["pixel_scale"]
        self.resize, self.input_size = pre["resize"], pre["input_size"]
        random_init = bool(cfg.get("allow_random_init"))
        self.tower = vision_tower(load_pretrained(cfg, architecture_only=random_init))
        self.weights_sha256 = "random-init" if random_init else weights_digest(folder)
        self.feature_dim = int(self.tower.config.hidden_size)
        self.layer = cfg.get("layer")
        # ViT and DINOv2 prepend a class token (and DINOv2-with-registers its registers); SigLIP none
        self.prefix_tokens = 0 if self.tower.config.model_type.startswith("siglip") else 1
        self.class_token = bool(cfg.get("class_token", True))

    @classmethod
    def input_defaults(cls, cfg: dict) -> dict:
        """What :func:`xmr.features.extract.input_settings` reads instead of the generic defaults."""
        return processor_settings(cfg)

    def forward(self, images, boxes=None):
        out = self.tower(pixel_values=images, output_hidden_states=self.layer is not None)
        tokens = out.last_hidden_state if self.layer is None else out.hidden_states[self.layer]
        if not self.class_token:
            tokens = tokens[:, self.prefix_tokens:]
        return tokens, None
