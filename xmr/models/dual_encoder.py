"""The two towers of a CLIP-style dual encoder (``CLIPModel``, ``SiglipModel``) saved in a local folder, in xmr's
pieces: the text tower as a :class:`~xmr.models.text.TextEncoder` (tokens for a head trained on top; the pooled,
projected caption embedding of ``get_text_features``), and the image head that turns the vision tower's output
tokens (the ``transformers`` backbone's regions, :mod:`xmr.features.backbones.transformers_vision`) into the
embedding of ``get_image_features``:

- CLIP: ``visual_projection(post_layernorm(tokens[:, 0]))``: the class token, so the tokens must keep it
  (``class_token: true``);
- SigLIP: the multi-head attention pooling ``head`` over all tokens (already after ``post_layernorm``).

The image trunk itself is the backbone (frozen by ``xmr extract``, or fine-tuned end to end): one copy of its
weights, wherever the run reads images from.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from xmr.core.errors import XmrError
from xmr.models.text import TextEncoder

DUAL_ENCODER_TYPES = ("clip", "siglip")


def load_dual_encoder(path: str | Path, architecture_only: bool = False) -> nn.Module:
    """``AutoModel`` of a CLIP-style folder; a missing folder or a model without both towers is one line."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise XmrError(f"model.path: {folder} is not a transformers model folder (no config.json); save a CLIPModel "
                       f"or SiglipModel there with save_pretrained (and its tokenizer and image processor)")
    config = AutoConfig.from_pretrained(folder)
    if config.model_type not in DUAL_ENCODER_TYPES:
        raise XmrError(f"model.path: {folder} holds a {config.model_type} model; a dual encoder is one of "
                       f"{', '.join(DUAL_ENCODER_TYPES)} (CLIPModel, SiglipModel)")
    return AutoModel.from_config(config) if architecture_only else AutoModel.from_pretrained(folder)


class DualTextTower(TextEncoder):
    """A dual encoder's text tower: ``forward`` gives its last hidden states ``(B, T, D)`` (a trained head pools
    them), :meth:`embed` the checkpoint's own caption embedding (``get_text_features``)."""

    pretrained_params = ["model.", "projection."]

    def __init__(self, model: nn.Module, tokenizer, max_len: int | None = None) -> None:
        super().__init__()
        self.model = model.text_model
        # CLIP projects the pooled token; SigLIP's text head (inside text_model) already did
        self.projection = getattr(model, "text_projection", None) or nn.Identity()
        self.tokenizer = tokenizer
        limit = int(model.config.text_config.max_position_embeddings)
        self.max_len = min(max_len or limit, limit)
        # SigLIP was trained on captions padded to the full length (its model card: padding="max_length")
        self.padding = "max_length" if model.config.model_type == "siglip" else "longest"
        self.out_dim = int(model.config.text_config.hidden_size)
        #: the joint embedding's width (what :meth:`embed` gives)
        self.embed_dim = int(model.config.projection_dim if model.config.model_type == "clip"
                             else model.config.text_config.projection_size)

    def collate(self, captions, tokens, indices=None, split=None):
        b = self.tokenizer(list(captions), padding=self.padding, truncation=True, max_length=self.max_len,
                           return_tensors="pt")
        return {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"],
                "lengths": b["attention_mask"].sum(1)}

    def _run(self, batch):
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    def forward(self, batch):
        h = self._run(batch).last_hidden_state
        return h, batch["lengths"].to(h.device)

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, E) caption embeddings, as ``get_text_features`` gives them (not normalised)."""
        return self.projection(self._run(batch).pooler_output)


class ImageHead(nn.Module):
    """Output tokens of the vision tower ``(B, R, D)`` -> ``(B, E)`` image embeddings (``get_image_features``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        vision = model.vision_model
        self.kind = model.config.model_type
        if self.kind == "clip":
            self.norm, self.projection = vision.post_layernorm, model.visual_projection
        else:
            self.pool = vision.head
        self.in_dim = int(model.config.vision_config.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.kind == "clip":
            return self.projection(self.norm(tokens[:, 0]))
        return self.pool(tokens)


class LogitScale(nn.Module):
    """The checkpoint's learned temperature (``logit_scale``, used as ``exp``) and SigLIP's ``logit_bias``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.scale = model.logit_scale
        self.bias = getattr(model, "logit_bias", None)


def dual_encoder_parts(path: str | Path, max_len: int | None = None,
                       architecture_only: bool = False) -> nn.ModuleDict:
    """``{text, image_head, logit}`` of the folder's dual encoder (their state-dict keys are the method's)."""
    from transformers import AutoTokenizer

    model = load_dual_encoder(path, architecture_only)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise XmrError(f"model.path: {path}: no tokenizer ({type(e).__name__}); save the model's tokenizer beside "
                       f"it with save_pretrained") from None
    return nn.ModuleDict({"text": DualTextTower(model, tokenizer, max_len), "image_head": ImageHead(model),
                          "logit": LogitScale(model)})
