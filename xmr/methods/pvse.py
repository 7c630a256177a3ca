"""PVSE (Song & Soleymani, CVPR'19): K PIE-Net embeddings per image and per caption, MIL similarity.

Image: global g = FC(average-pooled local features); K heads of structured self-attention over the local
features give residuals v̂_k = sigmoid(FC(u_k)); embeddings LN(g + v̂_k), L2-normalised (:mod:`xmr.models.set_heads`).
Caption: g = pooled BiGRU outputs (``text_pool``: mean; the code takes the last word), K heads over the word
embeddings (yalesong/pvse ``model.py``).
Loss (``loss.py`` PVSELoss): hardest-negative triplet on the MIL similarity max_{k,l} cos(v_k, t_l) (mean
reduction) + ``div_weight`` · diversity (‖off-diagonal Gram‖_F / K² of each modality's residuals) +
``mmd_weight`` · MMD(all image elements, all caption elements); both regularisers only when K > 1.
``loss.warmup_epochs``: summed hinges before this epoch, then the hardest negative (default 0, as the code).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xmr.config.loader import method_schema
from xmr.losses.set_regularizers import gram_diversity, mmd_rbf
from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.set_heads import PIEImageHead, PIETextHead
from xmr.similarity.measures import set_similarity


@dataclass(frozen=True)
class PVSEModel:
    """The ``model`` section (:attr:`PVSE.schema`)."""
    embed_dim: int
    num_embeds: int
    attention_hidden: int | None
    activation: str
    dropout: float
    image_pool: str
    text_pool: str
    text_attention_input: str


@dataclass(frozen=True)
class PVSELoss:
    """The ``loss`` section (:attr:`PVSE.schema`)."""
    margin: float
    max_violation: bool
    warmup_epochs: float
    reduction: str
    similarity: str
    div_weight: float
    mmd_weight: float
    mmd_gamma: float


@METHODS.register("pvse")
class PVSE(RetrievalModel):
    model_settings_class, loss_settings_class = PVSEModel, PVSELoss
    conformance_overrides = {"model": {"num_embeds": 2}}
    gathered_loss = True  # the loss reads the forward's per-pair tensors only: DDP may gather the global batch
    schema = method_schema("pvse")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m = self.model_settings
        k = m.num_embeds
        self.image_head = PIEImageHead(image_dim, self.embed_dim, k, m.attention_hidden, m.activation,
                                       m.dropout, m.image_pool)
        self.text = self.build_text_encoder()
        self.text_head = PIETextHead(self.text, self.embed_dim, k, m.attention_hidden, m.activation,
                                     m.dropout, m.text_pool, m.text_attention_input)

    def image_outputs(self, feats, num_regions):
        out = self.image_head(feats, num_regions)
        return {"img": out["embeddings"], "image_residuals": out["residuals"]}

    def text_outputs(self, batch):
        out = self.text_head(self.text, batch)
        return {"txt": out["embeddings"], "text_residuals": out["residuals"]}

    def encode_image(self, feats, num_regions):
        return self.image_outputs(feats, num_regions)["img"]

    def encode_text(self, batch):
        return self.text_outputs(batch)["txt"]

    def compute_loss(self, out, positives, epoch):
        # similarities and regularisers in fp32 even under AMP (exp(α·c) with α = 16, small stds)
        with torch.autocast(out["img"].device.type, enabled=False):
            return self._loss(out["img"].float(), out["txt"].float(), out, positives, epoch)

    def _loss(self, img, txt, out, positives, epoch):
        lc = self.loss_settings
        # the heads' embeddings are unit vectors already: not normalised twice
        sims = set_similarity(img, txt, lc.similarity, alpha=self.scoring.alpha, normalize=False)
        hardest = lc.max_violation and epoch >= lc.warmup_epochs  # ``epoch`` counts from 0
        ranking = triplet_loss(sims, positives, lc.margin, hardest, lc.reduction)
        terms = {"ranking": ranking}
        loss = ranking
        if img.shape[1] > 1 and lc.div_weight > 0:
            div = (gram_diversity(out["image_residuals"].float())
                   + gram_diversity(out["text_residuals"].float()))
            loss = loss + lc.div_weight * div
            terms["diversity"] = div
        if img.shape[1] > 1 and lc.mmd_weight > 0:
            mmd = mmd_rbf(img.reshape(-1, img.shape[-1]), txt.reshape(-1, txt.shape[-1]), lc.mmd_gamma)
            loss = loss + lc.mmd_weight * mmd
            terms["mmd"] = mmd
        return {"loss": loss, **terms}
