"""DivE (Kim, Kim & Kwak, "Improving Cross-Modal Retrieval with Set of Diverse Embeddings", CVPR'23).

Both modalities become a set of K = 4 embeddings from a slot-attention set prediction module
(:mod:`xmr.models.slot_attention`: learnable slots, T = 4 weight-shared aggregation blocks, attention softmaxed
over the slots, residual update, pre-LN GELU MLP, output LN(E^T) + LN(global), L2-normalised).
Image: local features -> FC + residual 2-layer MLP (ROI setting; ``model.image_mlp_input``: the MLP reads the raw
features as VSE∞'s, or the FC's output as the released code's ``--gpo_1x1``) -> dropout; global = max-pool of
the projected features (ROI) or average (conv). Caption: the SPM reads the word embeddings (released code),
the global feature is the BiGRU's last hidden state (``model.text_global: last_hidden``, the paper; the code
averages the final forward and backward states, which is what the encoder's last hidden state is here);
``model.text_dropout`` drops the word embeddings, the BiGRU's outputs and its final state in training (the code's
``EncoderText.forward``, 0.1).
Training-time augmentation (:mod:`xmr.models.augment`, training mode only; defaults = released
``--butd_drop_prob 0.2 --caption_drop_prob 0.2``, paper readings as options): each local feature dropped with
p = 0.2 before the projection (2-D grid positions are dropped with their cells), each inner caption token hit
with p = 0.2 and then masked (50%), replaced (10%) or deleted (40%).
Similarity: smooth-Chamfer (α = 16) for training and retrieval (:func:`xmr.similarity.measures.set_similarity`).
The global branch alone (``model.set_module: false``, no MMD) is DivE's base: each side l2norm(LN(global)), one
embedding, whose smooth-Chamfer score is the cosine (tests/test_reductions.py).
Loss: triplet on the smooth-Chamfer matrix, summed hinges in the first ``loss.warmup_epochs`` (the supplement, for
its ResNeXt-101 + BERT setting: "In the first epoch, triplet loss without mining is used"; the released BUTD script:
none) and the hardest negative after (mean reduction, as the code) +
0.01 · MMD(all image elements, all caption elements) + 0.01 · diversity (mean over a set's element pairs of
exp(-2‖x - x'‖²) of the L2-normalised slots before the global feature is added; both modalities).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from xmr.config.loader import method_schema
from xmr.core.errors import XmrError
from xmr.losses.set_regularizers import mmd_rbf, pairwise_uniformity
from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.augment import augment_caption_batch, compact, region_keep_mask
from xmr.models.image import LocalProjection
from xmr.models.set_heads import POOLS, text_global_and_local, text_local_dim
from xmr.models.slot_attention import SetPredictionModule, sine_positions_1d, sine_positions_2d
from xmr.similarity.measures import set_similarity

# the code scales every non-CNN image parameter and the text SPM (whose LN_g the global-only base keeps as *_global_norm)
SPM_PREFIXES = ("image_proj.", "image_spm.", "text_spm.", "image_global_norm.", "text_global_norm.")
#: model.spm_lr_scope -> (parameter-name prefixes at lr x spm_lr_scale, prefixes among them kept at lr):
#: ``code`` the released train.py's groups; ``paper`` "the set prediction modules" alone, without the global
#: feature's LayerNorm LN_g (the global branch's, as in DivE's base)
SPM_LR_SCOPES = {"code": (SPM_PREFIXES, ()),
                 "paper": (("image_spm.", "text_spm."), ("image_spm.ln_global.", "text_spm.ln_global."))}


@dataclass(frozen=True)
class DivEModel:
    """The ``model`` section (:attr:`DivE.schema`)."""
    embed_dim: int
    num_embeds: int
    iterations: int
    heads: int
    dim_head: int
    ff_mult: int
    dropout: float
    pad_mode: str
    learnable_slots: bool
    slot_update: str
    add_global: bool
    image_residual_mlp: bool
    image_mlp_input: str
    image_global_pool: str
    image_pos_enc: str
    text_local: str
    text_global: str
    set_module: bool
    text_pos_enc: str
    text_pos_length: str
    spm_lr_scale: float
    spm_lr_scope: str
    size_augment: dict
    text_augment: float
    text_augment_style: str
    text_dropout: float


@dataclass(frozen=True)
class DivELoss:
    """The ``loss`` section (:attr:`DivE.schema`)."""
    margin: float
    similarity: str
    alpha: float
    max_violation: bool
    warmup_epochs: float
    reduction: str
    mmd_weight: float
    mmd_gamma: float
    div_weight: float
    div_scale: float


@METHODS.register("dive")
class DivE(RetrievalModel):
    model_settings_class, loss_settings_class = DivEModel, DivELoss
    conformance_overrides = {"model": {"num_embeds": 3, "iterations": 2, "heads": 2, "dim_head": 8}}
    gathered_loss = True  # the loss reads the forward's per-pair tensors only: DDP may gather the global batch
    schema = method_schema("dive")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m = self.model_settings
        d = self.embed_dim
        spm_kw = dict(num_slots=m.num_embeds, iterations=m.iterations, heads=m.heads,
                      dim_head=m.dim_head, ff_mult=m.ff_mult, dropout=m.dropout, pad_mode=m.pad_mode,
                      learnable_slots=m.learnable_slots, update=m.slot_update, add_global=m.add_global)
        if not m.set_module and not m.add_global:
            raise XmrError("model.set_module: false leaves the global feature alone, but model.add_global is false: "
                           "nothing would be embedded; set model.add_global: true")
        if m.spm_lr_scope not in SPM_LR_SCOPES:
            raise XmrError(f"model.spm_lr_scope: {m.spm_lr_scope!r} is not one of {', '.join(SPM_LR_SCOPES)}")
        self.image_proj = LocalProjection(image_dim, d, m.image_residual_mlp, m.image_mlp_input)
        self.image_dropout = nn.Dropout(m.dropout)
        if m.set_module:
            self.image_spm = SetPredictionModule(d, d, **spm_kw)
        else:  # the global branch alone: l2norm(LN(global)), the LN_g of Eq. 5
            self.image_global_norm = nn.LayerNorm(d)
        self.text = self.build_text_encoder()
        if self.text.out_dim != d:
            raise XmrError(f"text encoder gives {self.text.out_dim}-d outputs, the joint space is {d}-d")
        self.text_dim = text_local_dim(self.text, m.text_local)
        # no parameters: the state dict and the initialisation are those of text_dropout 0
        self.text_dropout = nn.Dropout(m.text_dropout) if m.text_dropout > 0 else None
        if m.set_module:
            self.text_spm = SetPredictionModule(self.text_dim, d, **spm_kw)
        else:
            self.text_global_norm = nn.LayerNorm(d)

    def encode_image(self, feats, num_regions):
        return self.image_outputs(feats, num_regions)["img"]

    def encode_text(self, batch):
        return self.text_outputs(batch)["txt"]

    def image_outputs(self, feats, num_regions):
        m = self.model_settings
        pos = None
        if m.image_pos_enc == "sine2d":  # one position per grid cell, fixed before any cell is dropped
            pos = sine_positions_2d(feats.shape[1], self.embed_dim, feats.device)[None]
        aug = m.size_augment
        if self.training and aug["mode"] != "none" and aug["p"] > 0:
            keep = region_keep_mask(num_regions, feats.shape[1], aug["mode"], aug["p"])
            if pos is not None:
                pos = compact(pos.expand(feats.shape[0], -1, -1), keep)[0]
            feats, num_regions = compact(feats, keep)
        local = self.image_dropout(self.image_proj(feats))
        glob = POOLS[m.image_global_pool](local, num_regions)
        if not m.set_module:
            return {"img": F.normalize(self.image_global_norm(glob), dim=-1)[:, None, :]}
        out = self.image_spm(local, num_regions, glob, None if pos is None else pos.to(local.dtype))
        res = {"img": out["embeddings"], "image_slots": out["slots"]}
        if not self.training:  # the slot maps of a figure (DivE Fig. 4); the training forward carries no more
            res["image_attention"] = out["attention"]
        return res

    def text_outputs(self, batch):
        m = self.model_settings
        if self.training:
            batch = augment_caption_batch(batch, self.text, m.text_augment, m.text_augment_style)
        glob, local, lengths = text_global_and_local(self.text, batch, m.text_global, m.text_local, self.text_dropout)
        if not m.set_module:
            return {"txt": F.normalize(self.text_global_norm(glob), dim=-1)[:, None, :]}
        pos = None
        if m.text_pos_enc == "sine1d":
            pos = sine_positions_1d(lengths, local.shape[1], self.text_dim, m.text_pos_length).to(local.dtype)
        out = self.text_spm(local, lengths, glob, pos)
        return {"txt": out["embeddings"], "text_slots": out["slots"]}

    def compute_loss(self, out, positives, epoch):
        # similarities and regularisers in fp32 even under AMP (exp(α·c) with α = 16, small stds)
        with torch.autocast(out["img"].device.type, enabled=False):
            return self._loss(out["img"].float(), out["txt"].float(), out, positives, epoch)

    def _loss(self, img, txt, out, positives, epoch):
        lc = self.loss_settings
        sims = set_similarity(img, txt, lc.similarity, alpha=lc.alpha)
        hardest = lc.max_violation and epoch >= lc.warmup_epochs  # ``epoch`` counts from 0
        ranking = triplet_loss(sims, positives, lc.margin, hardest, lc.reduction)
        loss, terms = ranking, {"ranking": ranking}
        if lc.mmd_weight > 0:
            mmd = mmd_rbf(img.reshape(-1, img.shape[-1]), txt.reshape(-1, txt.shape[-1]), lc.mmd_gamma)
            loss = loss + lc.mmd_weight * mmd
            terms["mmd"] = mmd
        if lc.div_weight > 0 and img.shape[1] > 1:
            div = (pairwise_uniformity(out["image_slots"].float(), lc.div_scale)
                   + pairwise_uniformity(out["text_slots"].float(), lc.div_scale))
            loss = loss + lc.div_weight * div
            terms["diversity"] = div
        return {"loss": loss, **terms}

    def param_groups(self, lr: float, backbone_scale: float) -> list[dict]:
        """Base groups, with the parameters of ``model.spm_lr_scope`` (:data:`SPM_LR_SCOPES`) at
        ``lr * spm_lr_scale``."""
        groups = super().param_groups(lr, backbone_scale)
        scale = self.model_settings.spm_lr_scale
        if scale == 1.0:
            return groups
        scaled, kept = SPM_LR_SCOPES[self.model_settings.spm_lr_scope]
        spm = [p for n, p in self.named_parameters()
               if n.startswith(scaled) and not n.startswith(kept) and p.requires_grad]
        if not spm:  # paper scope without the set modules (model.set_module: false)
            return groups
        spm_ids = {id(p) for p in spm}
        for g in groups:
            g["params"] = [p for p in g["params"] if id(p) not in spm_ids]
        return [g for g in groups if g["params"]] + [{"params": spm, "lr": lr * scale, "name": "spm"}]
