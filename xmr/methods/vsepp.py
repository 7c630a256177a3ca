"""VSE++ (Faghri et al., BMVC'18): FC image projection + mean pooling, BiGRU text, hardest-negative triplet."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from xmr.config.loader import method_schema
from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.image import LocalProjection
from xmr.models.pooling import POOLS as _POOLS

POOLS = {k: _POOLS[k] for k in ("mean", "max", "last")}  # last: the released code's GRU read (text)


@dataclass(frozen=True)
class VSEPPModel:
    """The ``model`` section (:attr:`VSEPP.schema`)."""
    embed_dim: int
    residual_mlp: bool
    image_pool: str
    text_pool: str
    image_encoder: str | None = None  # no schema default: absent = regions


@dataclass(frozen=True)
class VSEPPLoss:
    """The ``loss`` section (:attr:`VSEPP.schema`)."""
    margin: float
    max_violation: bool
    reduction: str
    warmup_epochs: float


@METHODS.register("vsepp")
class VSEPP(RetrievalModel):
    model_settings_class, loss_settings_class = VSEPPModel, VSEPPLoss
    gathered_loss = True  # the loss reads only (img, txt, positives): DDP may gather the global batch
    schema = method_schema("vsepp")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m = self.model_settings
        self.image_proj = LocalProjection(image_dim, self.embed_dim, m.residual_mlp)
        self.text = self.build_text_encoder()
        self.image_pool, self.text_pool = POOLS[m.image_pool], POOLS[m.text_pool]
        self.full_image = m.image_encoder == "full_image"

    def encode_image(self, feats, num_regions):
        if self.full_image:  # l2norm(fc(l2norm(cnn(x)))): the normalisation sits between pooling and fc
            pooled = F.normalize(self.image_pool(feats, num_regions), dim=-1)
            return F.normalize(self.image_proj(pooled.unsqueeze(1)).squeeze(1), dim=-1)
        return F.normalize(self.image_pool(self.image_proj(feats), num_regions), dim=-1)

    def encode_text(self, batch):
        h, lengths = self.text(batch)
        return F.normalize(self.text_pool(h, lengths), dim=-1)

    def compute_loss(self, out, positives, epoch):
        img, txt, lc = out["img"], out["txt"], self.loss_settings
        hardest = lc.max_violation and epoch >= lc.warmup_epochs
        loss = triplet_loss(img @ txt.t(), positives, lc.margin, hardest, lc.reduction)
        return {"loss": loss}
