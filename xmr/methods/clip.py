"""A CLIP-style dual encoder (CLIP, Radford et al. 2021; SigLIP, Zhai et al. 2023) from a local checkpoint folder.

The image embedding is the checkpoint's own head on the vision tower's output tokens (the run's ``transformers``
backbone: tokens extracted by ``xmr extract``, or the tower fine-tuned end to end), the caption embedding its text
tower's (:mod:`xmr.models.dual_encoder`); both L2-normalised and compared by cosine, which is exactly the cosine of
``get_image_features`` and ``get_text_features``. A zero-shot run is imported from the folder, not trained
(``xmr import-checkpoint --format transformers``, :mod:`xmr.checkpoints.transformers_towers`); training fine-tunes
both towers with the checkpoint's loss (CLIP's symmetric InfoNCE or SigLIP's sigmoid loss) at its learned scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from xmr.config.loader import method_schema
from xmr.core.errors import XmrError
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel


@dataclass(frozen=True)
class ClipModel:
    """The ``model`` section (:attr:`Clip.schema`)."""
    path: str
    embed_dim: int
    max_len: int | None = None


@dataclass(frozen=True)
class ClipLoss:
    """The ``loss`` section (:attr:`Clip.schema`)."""
    kind: str


def contrastive_loss(logits: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """CLIP's symmetric InfoNCE, with every positive of a row (another caption of the same image) in the numerator:
    the mean over images and captions of ``-log(sum_pos exp / sum_all exp)``."""
    neg_inf = torch.finfo(logits.dtype).min
    pos = logits.masked_fill(~positives, neg_inf)
    rows = torch.logsumexp(logits, 1) - torch.logsumexp(pos, 1)
    cols = torch.logsumexp(logits, 0) - torch.logsumexp(pos, 0)
    return (rows.mean() + cols.mean()) / 2


def sigmoid_loss(logits: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """SigLIP's loss: ``-sum log sigmoid(z_ij * logit_ij) / B`` with z = +1 for pairs, -1 otherwise."""
    sign = positives.float() * 2 - 1
    return -F.logsigmoid(sign * logits).sum() / len(logits)


@METHODS.register("clip")
class Clip(RetrievalModel):
    model_settings_class, loss_settings_class = ClipModel, ClipLoss
    gathered_loss = True  # the loss reads only (img, txt, positives)
    schema = method_schema("clip")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        from xmr.models.dual_encoder import dual_encoder_parts

        super().__init__(settings, image_dim, vocab_words)
        m = self.model_settings
        parts = dual_encoder_parts(m.path, m.max_len)
        self.text, self.image_head, self.logit = parts["text"], parts["image_head"], parts["logit"]
        if image_dim != self.image_head.in_dim:
            raise XmrError(f"clip: the image features are {image_dim}-d but {m.path}'s vision tower gives "
                           f"{self.image_head.in_dim}-d tokens; read its tokens (a transformers backbone whose "
                           f"weights: is this folder, config/backbones.yaml)")
        width = self.text.embed_dim
        if m.embed_dim != width:
            raise XmrError(f"clip: model.embed_dim {m.embed_dim} but {m.path} embeds in {width} dimensions; "
                           f"set model.embed_dim: {width}")

    def encode_image(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.image_head(feats), dim=-1)

    def encode_text(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.normalize(self.text.embed(batch), dim=-1)

    def compute_loss(self, out, positives, epoch):
        logits = out["img"] @ out["txt"].t() * self.logit.scale.exp()
        if self.loss_settings.kind == "sigmoid":
            bias = self.logit.bias if self.logit.bias is not None else 0.0
            return {"loss": sigmoid_loss(logits + bias, positives)}
        return {"loss": contrastive_loss(logits, positives)}

    @staticmethod
    def conformance_setup(config_dir: Path, folder: Path) -> dict:
        """The registry's conformance test at toy size: a random tiny CLIP in ``folder``, its tower as backbone
        ``conformance_clip`` of ``config_dir``, trained end to end from the images."""
        import yaml

        from xmr.models.tiny_towers import save_tiny_tower

        save_tiny_tower("clip", folder, hidden=32)
        table = yaml.safe_load((config_dir / "backbones.yaml").read_text()) or {}
        table["conformance_clip"] = {"name": "transformers", "weights": str(folder), "batch_size": 16}
        (config_dir / "backbones.yaml").write_text(yaml.safe_dump(table))
        return {"model": {"path": str(folder), "embed_dim": 32},
                "features": {"source": "images", "backbone": "conformance_clip"}}
