"""DVSE's variance-aware weighting loss L_var (Wei et al., arXiv 2309.08154, Eqs. 5-11).

Every image sub-embedding v_i^k is ranked against the single caption embeddings t_j of the batch, with a
VSE++ hardest-negative hinge weighted by 1/σ² and a Kendall-style + log σ term (Eq. 11):

    L_var = Σ_k Σ_i (1/σ_ik²) max_j [α + S(v_i^k, t_j) − S(v_i^k, t_i)]_+ + log σ_ik        (image → text)
          + Σ_k Σ_i (1/σ_ik²) max_j [α + S(t_i, v_j^k) − S(t_i, v_i^k)]_+ + log σ_ik        (text → image)

    σ_ik = Std{ S(v_i^k, t_j) : j ≠ i } + 1                                                   (Eq. 8)

The std is over the "mixed distribution" of every in-batch caption except the target: negatives *and* the
non-target positives (other captions of the same image). Options for what the paper leaves open (card A4-A6):
``sigma_source`` (``cosine`` similarities, default; ``softmax`` probabilities over the batch, the literal
Eq. 6, nearly constant), ``detach_sigma`` (default True: σ is a weight; False lets gradients flow through σ and
log σ, Kendall-style), ``t2i_sigma`` (``image_row``: reuse σ_ik of the positive image, default; ``column``: the
std of S(v_j^k, t_i) over images j ≠ i), ``t2i_negatives`` (``slotwise``: the k-th sub-embedding of other
images, literal; ``set``: their best sub-embedding). ``weighting=False`` is the plain per-slot triplet loss
(σ ≡ 1, no log term): the paper's "w/o L_var" ablation. ``hardest=False`` replaces each max over negatives by
the sum of the hinges over them (VSE0; the warm-up of card A13, as VSE∞'s ``vse_mean_warmup_epochs``).
"""

from __future__ import annotations

import torch

from xmr.core.errors import XmrError

_NEG_FILL = -1e4  # below any cosine; avoids inf arithmetic when a row has no negatives


def _masked_std(values: torch.Tensor, keep: torch.Tensor, dim: int) -> torch.Tensor:
    """Unbiased std of ``values`` where ``keep`` is True, along ``dim`` (0 where fewer than 2 values)."""
    keep = keep.to(values.dtype)
    n = keep.sum(dim=dim, keepdim=True)
    mean = (values * keep).sum(dim=dim, keepdim=True) / n.clamp(min=1)
    var = (((values - mean) * keep) ** 2).sum(dim=dim, keepdim=True) / (n - 1).clamp(min=1)
    std = var.clamp(min=0).sqrt() * (n > 1).to(values.dtype)
    return std.squeeze(dim)


def subembedding_sigma(sims: torch.Tensor, source: str = "cosine", direction: str = "image_row",
                       offset: float = 1.0) -> torch.Tensor:
    """σ (B, K) from ``sims[i, k, j]`` = S(v_i^k, t_j) (B, K, B), target pairs on the diagonal i = j.

    ``direction``: ``image_row`` = std over captions j ≠ i of S(v_i^k, t_j); ``column`` = std over images
    j ≠ i of S(v_j^k, t_i) (indexed by the caption i).
    """
    b = sims.shape[0]
    not_target = ~torch.eye(b, dtype=torch.bool, device=sims.device)[:, None, :]  # (B, 1, B) j ≠ i
    if source == "cosine":
        values = sims
    elif source == "softmax":
        values = sims.softmax(dim=2 if direction == "image_row" else 0)
    else:
        raise XmrError(f"loss.sigma.source: {source!r} is not one of cosine, softmax")
    if direction == "image_row":
        std = _masked_std(values, not_target.expand_as(values), dim=2)  # (B, K)
    elif direction == "column":
        std = _masked_std(values, not_target.expand_as(values), dim=0).t()  # (K, B) -> (B, K)
    else:
        raise XmrError(f"loss.sigma.t2i: {direction!r} is not one of image_row, column")
    return std + offset


def variance_aware_loss(sims: torch.Tensor, pos_mask: torch.Tensor | None = None, margin: float = 0.2,
                        weighting: bool = True, sigma_source: str = "cosine", detach_sigma: bool = True,
                        t2i_sigma: str = "image_row", t2i_negatives: str = "slotwise", sigma_offset: float = 1.0,
                        active: torch.Tensor | None = None, reduction: str = "sum",
                        hardest: bool = True) -> dict[str, torch.Tensor]:
    """L_var of a batch of B (image, caption) pairs.

    ``sims`` (B, K, B): S(v_i^k, t_j), cosine of the i-th image's k-th sub-embedding and the j-th caption.
    ``pos_mask`` (B, B): True where caption j belongs to image i (excluded from the hardest negatives but kept
    in σ's sample); None = the diagonal only. ``active`` (B, K): per-(i, k) 0/1 weights (DVSE mask mode
    ``drop_terms``). ``hardest``: True = the hardest negative (Eq. 11); False = the sum of the hinges over all
    negatives. Returns ``loss`` and diagnostics ``sigma`` (B, K), ``hinge_i2t``, ``hinge_t2i`` (B, K).
    """
    b, k, b2 = sims.shape
    if b != b2:
        raise XmrError(f"variance_aware_loss: sims must be (B, K, B), got {tuple(sims.shape)}")
    if t2i_negatives not in ("slotwise", "set"):
        raise XmrError(f"loss.t2i_negatives: {t2i_negatives!r} is not one of slotwise, set")
    eye = torch.eye(b, dtype=torch.bool, device=sims.device)
    pos = eye if pos_mask is None else (pos_mask.bool() | eye)
    positive = sims.diagonal(dim1=0, dim2=2).t()  # (B, K): S(v_i^k, t_i)

    # positives get _NEG_FILL, so they are never the hardest negative and their summed hinges are 0
    row = sims.masked_fill(pos[:, None, :], _NEG_FILL)  # read as (i image, k, j caption): i2t
    col = row  # the same tensor read as (j image, k, i caption): t2i; pos[j, i] = caption i is j's
    if t2i_negatives == "set":
        col = col.amax(dim=1, keepdim=True).expand(-1, k, -1)
    if hardest:
        hinge_i2t = (margin + row.amax(dim=2) - positive).clamp(min=0)  # hardest caption j, (B, K)
        hinge_t2i = (margin + col.amax(dim=0).t() - positive).clamp(min=0)  # hardest image j, (K, B) -> (B, K)
    else:
        hinge_i2t = (margin + row - positive[:, :, None]).clamp(min=0).sum(dim=2)
        hinge_t2i = (margin + col - positive.t()[None, :, :]).clamp(min=0).sum(dim=0).t()

    if weighting:
        sigma_row = subembedding_sigma(sims, sigma_source, "image_row", sigma_offset)
        sigma_col = sigma_row if t2i_sigma == "image_row" else subembedding_sigma(sims, sigma_source, t2i_sigma,
                                                                                  sigma_offset)
        if detach_sigma:
            sigma_row, sigma_col = sigma_row.detach(), sigma_col.detach()
        terms = (hinge_i2t / sigma_row ** 2 + sigma_row.log()) + (hinge_t2i / sigma_col ** 2 + sigma_col.log())
    else:
        sigma_row = torch.ones_like(positive)
        terms = hinge_i2t + hinge_t2i
    if active is not None:
        terms = terms * active.to(terms.dtype)
    loss = terms.sum() if reduction == "sum" else terms.sum() / b
    return {"loss": loss, "sigma": sigma_row.detach(), "hinge_i2t": hinge_i2t.detach(),
            "hinge_t2i": hinge_t2i.detach()}


__all__ = ["subembedding_sigma", "variance_aware_loss"]
