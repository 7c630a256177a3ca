"""DVSE's dynamic orthogonal constraint L_dc (Wei et al., arXiv 2309.08154, Eq. 4).

    L_dc = [ Σ_i Σ_{j≠i} ‖ F_mask(v̂^i)ᵀ F_mask(v̂^j) ‖ − β ]_+          (per image; β = 0.4)

on an image's K sub-embedding residuals v̂ (B, K, D) and its binary dynamic mask m (B, K). Without a mask it is
the paper's L_ort ablation. How the hinge is normalised is ambiguous (method card A3), so it is an option:

- ``mean`` (default): [ mean over active ordered pairs of |cos(v̂^i, v̂^j)| − β ]_+. Sigmoid residuals are all
  positive, so their pairwise cosines sit well above 0 and a *sum* over K(K−1) = 30 pairs never drops below
  β = 0.4: β would then be a constant shift with no effect on the gradient, contradicting the paper's β sweep.
- ``sum``: the printed form, [ Σ_{i≠j} |cos| − β ]_+.
- ``per_pair``: Σ_{i≠j} [ |cos| − β ]_+ (β as a per-pair correlation boundary).

``unit_vectors=False`` uses raw dot products instead of cosines (the literal ‖(v̂^i)ᵀ v̂^j‖).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xmr.core.errors import XmrError

DC_MODES = ("mean", "sum", "per_pair")


def dynamic_orthogonal_loss(residuals: torch.Tensor, mask: torch.Tensor | None = None, beta: float = 0.4,
                            mode: str = "mean", unit_vectors: bool = True,
                            reduction: str = "sum") -> torch.Tensor:
    """L_dc of a batch: ``residuals`` (B, K, D), ``mask`` (B, K) in {0, 1} (None: all active).

    Only pairs of two active sub-embeddings count. ``reduction``: ``sum`` or ``mean`` over the batch.
    """
    if mode not in DC_MODES:
        raise XmrError(f"loss.orthogonal.mode: {mode!r} is not one of {', '.join(DC_MODES)}")
    b, k, _ = residuals.shape
    x = F.normalize(residuals, dim=-1) if unit_vectors else residuals
    corr = (x @ x.transpose(1, 2)).abs()  # (B, K, K)
    off_diag = 1.0 - torch.eye(k, device=x.device, dtype=x.dtype)
    if mask is None:
        pairs = off_diag.expand(b, k, k)
    else:
        m = mask.to(x.dtype)
        pairs = m[:, :, None] * m[:, None, :] * off_diag
    if mode == "per_pair":
        per_image = (pairs * (corr - beta).clamp(min=0)).sum(dim=(1, 2))
    else:
        total = (pairs * corr).sum(dim=(1, 2))
        if mode == "mean":
            total = total / pairs.sum(dim=(1, 2)).clamp(min=1.0)
        per_image = (total - beta).clamp(min=0)
    return per_image.sum() if reduction == "sum" else per_image.mean()


__all__ = ["DC_MODES", "dynamic_orthogonal_loss"]
