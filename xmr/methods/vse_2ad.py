"""VSE+2AD (Zhang et al., EACL 2023): VSE with adaptive pooling (ADPOOL) and the adaptive objective (ADOPT).

Two towers: projected local features (FC + residual MLP for regions, FC for grids; BiGRU or BERT tokens) pooled to
one vector per modality by ADPOOL (separate weights per modality) and L2-normalised; cosine similarity. ADOPT is an
InfoNCE over the K hardest in-batch negatives with K from batch alignment/uniformity. Where the paper and the
released code (96-Zachary/vse_2ad) disagree, the code is the default and the paper a config option; the code's two
failure modes (NaN K, positive picked as a negative) are guarded by default. See docs/methods/vse_2ad.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from xmr.config.loader import method_schema
from xmr.losses.adaptive_objective import adopt_loss
from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.augment import augment_caption_batch, drop_regions
from xmr.models.image import LocalProjection
from xmr.models.pooler import Pooler


@dataclass(frozen=True)
class VSE2ADModel:
    """The ``model`` section (:attr:`VSE2AD.schema`)."""
    embed_dim: int
    residual_mlp: bool
    image_pool: str
    text_pool: str
    kmax_k: int
    adpool: dict
    gpo: dict
    size_augment: dict
    text_augment: float


@dataclass(frozen=True)
class VSE2ADLoss:
    """The ``loss`` section (:attr:`VSE2AD.schema`)."""
    name: str
    k_rule: str
    k_mode: str
    const_k: int
    scale: float
    tau: float
    margin: float
    diag_mask: str
    direction_reduce: str
    positive_in_denominator: bool
    guard_negative_base: bool
    warmup_epochs: float


@METHODS.register("vse_2ad")
class VSE2AD(RetrievalModel):
    model_settings_class, loss_settings_class = VSE2ADModel, VSE2ADLoss
    gathered_loss = True  # the loss reads only (img, txt, positives): DDP may gather the global batch
    schema = method_schema("vse_2ad")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m = self.model_settings
        self.image_proj = LocalProjection(image_dim, self.embed_dim, m.residual_mlp)
        pool = dict(gpo=m.gpo, adpool=m.adpool, kmax_k=m.kmax_k)
        self.image_pool = Pooler(m.image_pool, self.embed_dim, **pool, where="model.image_pool")
        self.text = self.build_text_encoder()
        self.text_pool = Pooler(m.text_pool, self.embed_dim, **pool, where="model.text_pool")

    def encode_image(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        if self.training:
            feats, num_regions = drop_regions(feats, num_regions, **self.model_settings.size_augment)
        return F.normalize(self.image_pool(self.image_proj(feats), num_regions), dim=-1)

    def encode_text(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.training:
            batch = augment_caption_batch(batch, self.text, self.model_settings.text_augment)
        h, lengths = self.text(batch)
        return F.normalize(self.text_pool(h, lengths), dim=-1)

    def compute_loss(self, out, positives, epoch):
        c = self.loss_settings
        sims = out["img"] @ out["txt"].t()
        if c.name == "triplet":
            hardest = epoch >= c.warmup_epochs
            return {"loss": triplet_loss(sims, positives, c.margin, hardest, "sum")}
        return adopt_loss(sims, positives, k_rule=c.k_rule, k_mode=c.k_mode, const_k=c.const_k,
                          scale=c.scale, tau=c.tau, neg_margin=c.margin, diag_mask=c.diag_mask,
                          direction_reduce=c.direction_reduce,
                          positive_in_denominator=c.positive_in_denominator,
                          guard_negative_base=c.guard_negative_base)
