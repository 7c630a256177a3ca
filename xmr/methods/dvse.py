"""DVSE (Wei et al., "Dynamic Visual Semantic Sub-Embeddings and Fast Re-ranking", arXiv 2309.08154).

Image: K sub-embeddings v^k = l2norm(LN(h_V(z) + s(W¹ att^k(z) z))) from a PIE-Net head (multi-head
self-attention + residual global embedding + LayerNorm; :mod:`xmr.models.set_heads`). Caption: one embedding
t = l2norm(LN(h_T(z_t) + s(W³ att_T(z_t) z_t))) (a one-head PIE-Net).

The global branch h_V, h_T (the base the sub-embeddings are residuals of), ``model.image_projection``:
``per_region`` (the method file's reading, after the paper's "pooling operation h_V" citing GPO and its Table V
row 5 ≈ VSE∞): VSE∞'s encoders, each region projected (FC + ``residual_mlp``) then pooled by ``image_pool``
(``gpo``), the caption's outputs pooled by ``text_pool`` (``gpo``), with the same modules as VSE∞ built in the
same order, so that with one embedding, no LayerNorm (``layer_norm: none``), no caption residual
(``text_residual: false``) and VSE∞'s loss DVSE *is* VSE∞, weight for weight. ``pooled_fc``: PVSE's heads,
h_V = FC(pool(z)) (the PVSE reading; with K = 1 DVSE is PVSE). Dynamic mask (Eq. 3):
m = round(sigmoid(mean_r(W² z_r))) ∈ {0,1}^K from a frozen random projection W² (K × F), all ones if empty.

Loss (Eq. 12): η · L_var + (1 − η) · L_dc, η = 0.6, with L_var the variance-aware weighting loss
(:mod:`xmr.losses.variance_aware`) and L_dc the dynamic orthogonal constraint (:mod:`xmr.losses.orthogonal`).
Test score: ``eval.similarity`` over the K sub-embeddings vs the caption (default ``max``).

Resolved ambiguities, each a config option (docs/methods/dvse.md has the reasoning):

- ``model.dynamic_mask.mode`` (where the mask acts): ``gate`` (default: m_k multiplies v̂_k before the
  residual, so a masked slot is LN(g), in training and at test), ``loss_only`` (the literal Eq. 4: the mask
  only selects L_dc's pairs), ``drop_terms`` (masked (i, k) leave L_var and the test max).
- ``loss.orthogonal.mode`` (how L_dc is normalised): ``mean`` (default), ``sum`` (printed), ``per_pair``;
  ``loss.orthogonal.target``: ``residuals`` v̂ (Eq. 4, default) or the final ``embeddings`` v.
- ``loss.sigma.detach`` (gradients through σ): true (default; σ is a weight) / false.
- ``eval.similarity`` (K sub-embeddings -> one score): ``max`` (default, PVSE's MIL) / ``mean``.
- ``model.layer_norm`` (where the LayerNorm sits): ``sum`` LN(h_V(z) + v̂) (default, the formula) / ``per_term``
  LN(h_V(z)) + LN(v̂); ``model.residual_scale`` λ in LN(h_V(z) + λ v̂) (default 1).
- ``loss.warmup_epochs`` (card A13): summed hinges over all negatives before this epoch, then the hardest
  negative; 0 (default, the paper) = hardest negatives from the start.

Table V ablation switches: ``model.dynamic_mask.enabled`` (DM), ``loss.ranking`` (``variance_aware`` = L_var;
``triplet_per_slot`` = w/o L_var: σ ≡ 1, plain per-slot VSE++; ``triplet_set`` = VSE++ on the set score),
``loss.orthogonal.enabled`` (L_ort), ``model.num_embeds: 1`` (w/o SE; ``model.attention: false`` is the
other reading, the global embedding alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from xmr.config.loader import method_schema
from xmr.core.errors import XmrError
from xmr.losses.orthogonal import dynamic_orthogonal_loss
from xmr.losses.triplet import triplet_loss
from xmr.losses.variance_aware import variance_aware_loss
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.augment import augment_caption_batch, drop_regions
from xmr.models.image import LocalProjection
from xmr.models.pooler import Pooler
from xmr.models.pooling import POOLS
from xmr.models.set_heads import PIEImageHead, PIENet, PIETextHead, text_global_and_local, text_local_dim
from xmr.similarity.measures import set_similarity


#: h_V's projection (``model.image_projection``) and poolings (``model.image_pool``, ``model.text_pool``)
IMAGE_PROJECTIONS = ("pooled_fc", "per_region")
IMAGE_POOLS = ("mean", "max", "gpo")
TEXT_POOLS = (*POOLS, "gpo")


def _mean_abs_offdiag_cos(x: torch.Tensor) -> torch.Tensor:
    """Mean over images and ordered pairs k ≠ l of |cos(x_k, x_l)|, x (B, K, D) with K > 1."""
    x = F.normalize(x, dim=-1)
    k = x.shape[1]
    return ((x @ x.transpose(1, 2)).abs().sum((1, 2)) - k).mean() / (k * (k - 1))


def _mean_over_processes(x: torch.Tensor) -> torch.Tensor:
    """Under DDP, the mean of ``x`` over the processes (equal batches: the global batch's mean, like SyncBN), so
    every process centres the dynamic mask with the same running mean that one process on the global batch would
    have; ``x`` itself otherwise."""
    import torch.distributed as td

    if td.is_available() and td.is_initialized() and td.get_world_size() > 1:
        x = x.clone()
        td.all_reduce(x)
        x /= td.get_world_size()
    return x


@dataclass(frozen=True)
class DVSEModel:
    """The ``model`` section (:attr:`DVSE.schema`)."""
    embed_dim: int
    num_embeds: int
    attention: bool
    attention_hidden: int | None
    activation: str
    dropout: float
    image_pool: str
    text_pool: str
    text_attention_input: str
    dynamic_mask: dict
    layer_norm: str
    residual_scale: float
    image_projection: str
    residual_mlp: bool
    gpo: dict
    text_residual: bool
    size_augment: dict
    text_augment: float


@dataclass(frozen=True)
class DVSELoss:
    """The ``loss`` section (:attr:`DVSE.schema`)."""
    margin: float
    eta: float
    ranking: str
    t2i_negatives: str
    reduction: str
    warmup_epochs: float
    sigma: dict
    orthogonal: dict


@METHODS.register("dvse")
class DVSE(RetrievalModel):
    model_settings_class, loss_settings_class = DVSEModel, DVSELoss
    conformance_overrides = {"model": {"num_embeds": 3}}
    gathered_loss = True  # the loss reads the forward's per-pair tensors only: DDP may gather the global batch
    schema = method_schema("dvse")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m, mask_cfg = self.model_settings, self.model_settings.dynamic_mask
        self.num_embeds = m.num_embeds if m.attention else 1
        self.mask_enabled = mask_cfg["enabled"] and m.attention
        self.mask_mode = mask_cfg["mode"]
        if self.mask_enabled and self.mask_mode == "drop_terms" and self.scoring.similarity != "max":
            raise XmrError(f"eval.similarity: {self.scoring.similarity!r} with model.dynamic_mask.mode "
                           f"drop_terms; masked sub-embeddings are left out of a max only: set eval.similarity: max")
        if m.image_projection == "per_region":
            self._build_vse_infinity_branch(image_dim)
        else:
            self._build_pvse_heads(image_dim)
        # W² of Eq. 3: a fixed random projection (a buffer: saved with the model, never trained)
        gen = torch.Generator().manual_seed(mask_cfg["seed"])
        bound = (6.0 / (self.num_embeds + image_dim)) ** 0.5  # xavier-uniform range
        self.register_buffer("mask_projection", (torch.rand(self.num_embeds, image_dim, generator=gen) * 2 - 1)
                             * bound)
        self.register_buffer("mask_feature_mean", torch.zeros(image_dim))
        self.register_buffer("mask_mean_ready", torch.zeros((), dtype=torch.bool))

    def _build_pvse_heads(self, image_dim: int) -> None:
        """``image_projection: pooled_fc``: PVSE's heads, built in PVSE's order (with K = 1, PVSE's weights)."""
        m = self.model_settings
        if m.image_pool not in ("mean", "max") or m.text_pool == "gpo":
            raise XmrError(f"model.image_pool {m.image_pool!r} / model.text_pool {m.text_pool!r}: gpo pools "
                           f"projected regions (VSE∞); set model.image_projection: per_region")
        if m.attention:
            self.image_head = PIEImageHead(image_dim, self.embed_dim, self.num_embeds, m.attention_hidden,
                                           m.activation, m.dropout, m.image_pool, m.layer_norm,
                                           m.residual_scale)
        else:  # w/o SE, "global only" reading: LN(h_V(z))
            self.image_global = nn.Linear(image_dim, self.embed_dim)
            self.image_norm = self._layer_norm()
            self.image_pool = POOLS[m.image_pool]
        self.text = self.build_text_encoder()
        if m.text_residual:
            self.text_head = PIETextHead(self.text, self.embed_dim, 1, m.attention_hidden, m.activation,
                                         m.dropout, m.text_pool, m.text_attention_input, self._text_norm())
        else:
            self.text_norm = self._layer_norm()

    def _build_vse_infinity_branch(self, image_dim: int) -> None:
        """``image_projection: per_region``: VSE∞'s encoders in VSE∞'s order (projection, image pooling, text
        encoder, text pooling), then the sub-embedding heads, which read the raw local features."""
        m, d = self.model_settings, self.embed_dim
        self.image_proj = LocalProjection(image_dim, d, m.residual_mlp)
        self.image_pool = Pooler(m.image_pool, d, gpo=m.gpo, where="model.image_pool")
        self.text = self.build_text_encoder()
        self.text_pool = Pooler(m.text_pool, d, gpo=m.gpo, where="model.text_pool")
        if m.attention:
            self.image_pie = PIENet(self.num_embeds, image_dim, d, m.attention_hidden, m.activation, m.dropout,
                                    norm=m.layer_norm, residual_scale=m.residual_scale)
        else:
            self.image_norm = self._layer_norm()
        if m.text_residual:
            self.text_pie = PIENet(1, text_local_dim(self.text, m.text_attention_input), d, m.attention_hidden,
                                   m.activation, m.dropout, norm=self._text_norm())
        else:
            self.text_norm = self._layer_norm()

    def _text_norm(self) -> str:
        """The caption's LN(h_T + t̂) (the formula; ``per_term`` reads the image side only), or none."""
        return "none" if self.model_settings.layer_norm == "none" else "sum"

    def _layer_norm(self) -> nn.Module:
        """The LayerNorm of a global branch without its residual (none: ``model.layer_norm: none``)."""
        return nn.Identity() if self.model_settings.layer_norm == "none" else nn.LayerNorm(self.embed_dim)

    # -- dynamic mask ---------------------------------------------------------------------------------
    def dynamic_mask(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        """(B, K) float in {0, 1}: round(sigmoid(mean_r(W² z_r))) = [W² mean_r(z) > 0]; all ones if empty."""
        pooled = POOLS["mean"](feats.float(), num_regions)
        mcfg = self.model_settings.dynamic_mask
        if mcfg["center"]:
            if self.training:
                with torch.no_grad():
                    batch_mean = _mean_over_processes(pooled.detach().mean(0))
                    if not bool(self.mask_mean_ready):
                        self.mask_feature_mean.copy_(batch_mean)
                        self.mask_mean_ready.fill_(True)
                    else:
                        self.mask_feature_mean.lerp_(batch_mean, mcfg["momentum"])
            pooled = pooled - self.mask_feature_mean
        with torch.autocast(feats.device.type, enabled=False):  # fp32: a half-precision sign could flip the bit
            mask = (pooled.detach().float() @ self.mask_projection.float().t() > 0).to(feats.dtype)
        empty = mask.sum(1, keepdim=True) == 0
        return torch.where(empty, torch.ones_like(mask), mask)

    # -- encoders -------------------------------------------------------------------------------------
    def image_outputs(self, feats, num_regions):
        """``img`` (B, K, D), the residuals v̂ (``image_residuals``) and the dynamic ``mask`` (B, K) (None
        without attention / without the mask)."""
        m = self.model_settings
        if self.training and m.size_augment["mode"] != "none":
            feats, num_regions = drop_regions(feats, num_regions, **m.size_augment)
        if m.image_projection == "per_region":
            g = self.image_pool(self.image_proj(feats), num_regions)
        elif not m.attention:
            g = self.image_global(self.image_pool(feats, num_regions))
        if not m.attention:  # w/o SE, "global only": LN(h_V(z))
            return {"img": F.normalize(self.image_norm(g), dim=-1)[:, None, :], "image_residuals": None,
                    "mask": None}
        mask = self.dynamic_mask(feats, num_regions) if self.mask_enabled else None
        gate = mask if self.mask_enabled and self.mask_mode == "gate" else None
        if m.image_projection == "per_region":
            out = self.image_pie(g, feats, num_regions, gate)
            out["embeddings"], out["global"] = F.normalize(out["embeddings"], dim=-1), g
        else:
            out = self.image_head(feats, num_regions, gate)
        emb = out["embeddings"]
        if mask is not None and self.mask_mode == "drop_terms" and not self.training:
            # test time: a masked slot is replaced by the image's first active one, so max over all K slots
            # equals the max over the active slots
            first = mask.argmax(dim=1)
            fill = emb[torch.arange(emb.shape[0], device=emb.device), first][:, None, :]
            emb = torch.where(mask[..., None].bool(), emb, fill)
        return {"img": emb, "image_residuals": out["residuals"], "mask": mask, "image_global": out["global"]}

    def encode_image(self, feats, num_regions):
        return self.image_outputs(feats, num_regions)["img"]

    def encode_text(self, batch):
        m = self.model_settings
        if self.training and m.text_augment > 0:
            batch = augment_caption_batch(batch, self.text, m.text_augment)
        if m.image_projection != "per_region":
            if m.text_residual:
                return self.text_head(self.text, batch)["embeddings"][:, 0]
            g, _, _ = text_global_and_local(self.text, batch, m.text_pool)
            return F.normalize(self.text_norm(g), dim=-1)
        h, lengths = self.text(batch)
        g = self.text_pool(h, lengths)
        if not m.text_residual:
            return F.normalize(self.text_norm(g), dim=-1)
        local = h if m.text_attention_input == "hidden" else self.text.embed(batch["ids"])
        return F.normalize(self.text_pie(g, local, lengths)["embeddings"][:, 0], dim=-1)

    # -- loss -----------------------------------------------------------------------------------------
    def compute_loss(self, out, positives, epoch):
        # similarities and regularisers in fp32 even under AMP (exp(α·c) with α = 16, small stds)
        with torch.autocast(out["img"].device.type, enabled=False):
            return self._loss(out["img"].float(), out["txt"].float(), out, positives, epoch)

    def _loss(self, img, txt, out, positives, epoch):
        lc = self.loss_settings
        mask, residuals = out.get("mask"), out.get("image_residuals")
        residuals = residuals.float() if residuals is not None else None
        terms: dict[str, torch.Tensor] = {}
        hardest = epoch >= lc.warmup_epochs  # ``epoch`` counts from 0 (fractional within an epoch)
        if lc.ranking == "triplet_set":
            # the embeddings are unit vectors already: not normalised twice (with K = 1 this is VSE∞'s img @ txt.T)
            sims = set_similarity(img, txt, self.eval_similarity, alpha=self.scoring.alpha, normalize=False)
            l_rank = triplet_loss(sims, positives, lc.margin, hardest, lc.reduction)
        else:
            sims = torch.einsum("bkd,cd->bkc", img, txt)  # S(v_i^k, t_j), (B, K, B)
            active = mask if (mask is not None and self.mask_mode == "drop_terms") else None
            var = variance_aware_loss(sims, positives, lc.margin, weighting=lc.ranking == "variance_aware",
                                      sigma_source=lc.sigma["source"], detach_sigma=lc.sigma["detach"],
                                      t2i_sigma=lc.sigma["t2i"], t2i_negatives=lc.t2i_negatives,
                                      sigma_offset=lc.sigma["offset"], active=active, reduction=lc.reduction,
                                      hardest=hardest)
            l_rank = var["loss"]
            terms["sigma_mean"] = var["sigma"].mean()
        loss = lc.eta * l_rank
        terms["l_var"] = l_rank
        oc = lc.orthogonal
        if residuals is not None and residuals.shape[1] > 1:
            with torch.no_grad():  # diagnostics: mean |cos| between an image's residuals / final sub-embeddings
                terms["residual_abs_cos"] = _mean_abs_offdiag_cos(residuals)
                terms["embedding_abs_cos"] = _mean_abs_offdiag_cos(img)
            if oc["enabled"]:
                target = residuals if oc["target"] == "residuals" else img
                l_dc = dynamic_orthogonal_loss(target, mask, oc["beta"], oc["mode"], oc["unit_vectors"],
                                               lc.reduction)
                loss = loss + (1 - lc.eta) * l_dc
                terms["l_dc"] = l_dc
        if mask is not None:
            terms["mask_active"] = mask.mean()
        return {"loss": loss, **terms}
