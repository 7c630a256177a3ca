"""VSE∞ (Chen et al., CVPR 2021): GPO pooling of projected local features for both modalities, VSE++ loss with a
warm-up of averaged hinges (VSE0) before the hardest negative (``vse_mean_warmup_epochs`` in woodfrog/vse_infty).

Training-time augmentations (random region/grid drop, caption token masking/replacement/deletion) come from
:mod:`xmr.models.augment`, shared with VSE+2AD, CODER and DivE; they run in training mode only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xmr.config.loader import method_schema
from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.augment import augment_caption_batch, drop_regions
from xmr.models.gpo import GPO
from xmr.models.image import LocalProjection
from xmr.models.pooling import l2_normalize


# -- the method ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VSEInfinityModel:
    """The ``model`` section (:attr:`VSEInfinity.schema`)."""
    embed_dim: int
    residual_mlp: bool
    gpo: dict
    l2_norm: str
    size_augment: dict
    text_augment: float


@dataclass(frozen=True)
class VSEInfinityLoss:
    """The ``loss`` section (:attr:`VSEInfinity.schema`)."""
    margin: float
    warmup_epochs: float
    reduction: str


@METHODS.register("vse_inf")
class VSEInfinity(RetrievalModel):
    model_settings_class, loss_settings_class = VSEInfinityModel, VSEInfinityLoss
    gathered_loss = True  # the loss reads only (img, txt, positives): DDP may gather the global batch
    schema = method_schema("vse_inf")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m = self.model_settings
        self.image_proj = LocalProjection(image_dim, self.embed_dim, m.residual_mlp)
        self.image_pool = GPO(**m.gpo)
        self.text = self.build_text_encoder()
        self.text_pool = GPO(**m.gpo)

    def encode_image(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        if self.training:
            feats, num_regions = drop_regions(feats, num_regions, **self.model_settings.size_augment)
        return l2_normalize(self.image_pool(self.image_proj(feats), num_regions), self.model_settings.l2_norm)

    def encode_text(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.training:
            batch = augment_caption_batch(batch, self.text, self.model_settings.text_augment)
        h, lengths = self.text(batch)
        return l2_normalize(self.text_pool(h, lengths), self.model_settings.l2_norm)

    def compute_loss(self, out, positives, epoch):
        img, txt, lc = out["img"], out["txt"], self.loss_settings
        hardest = epoch >= lc.warmup_epochs
        loss = triplet_loss(img @ txt.t(), positives, lc.margin, hardest, lc.reduction)
        return {"loss": loss, "max_violation": torch.tensor(float(hardest))}
