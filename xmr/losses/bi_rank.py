"""Bi-rank loss of RRF-Net (Liu et al., ICCV 2017; thesis ch. 5 eqs 5.7-5.10), after DSPE's top-N violations.

Distance d = -cos on L2-normalised embeddings (the thesis' 1 - cos gives identical hinges). For each anchor,
the negatives are the N closest (hardest) *margin-violating* items of other images in the batch; each
direction has a cross-modal and an intra-modal hinge on the same negatives::

    L = sum_i [ sum_{j in Y_i^-} w1 [d(x_i,y_i) - d(x_i,y_j) + m]_+ + w2 [d(x_i,y_i) - d(y_i,y_j) + m]_+
              + sum_{j in X_i^-} w3 [d(x_i,y_i) - d(x_j,y_i) + m]_+ + w4 [d(x_i,y_i) - d(x_i,x_j) + m]_+ ] / (N B)

The denominator is N*B even when fewer than N negatives violate the margin (the released Caffe layer).
With N = 1 and w = (1, 0, 1, 0) this is VSE++'s hardest-negative triplet loss averaged over the batch
(:func:`xmr.losses.triplet.triplet_loss` with ``reduction="mean"``); tests check that equivalence.
"""

from __future__ import annotations

import torch

NEGATIVE_SELECTIONS = ("most_violating", "most_dissimilar")


def _select(dist: torch.Tensor, candidates: torch.Tensor, n_neg: int, largest: bool) -> torch.Tensor:
    """Bool mask of the (at most) ``n_neg`` candidates per row with the smallest (or largest) distance."""
    k = min(n_neg, dist.shape[1])
    fill = -torch.inf if largest else torch.inf
    idx = dist.masked_fill(~candidates, fill).topk(k, dim=1, largest=largest).indices
    picked = torch.zeros_like(candidates).scatter_(1, idx, True)
    return picked & candidates


def bi_rank_loss(img: torch.Tensor, txt: torch.Tensor, pos_mask: torch.Tensor | None = None,
                 margin: float = 0.1, n_neg: int = 50,
                 weights: tuple[float, float, float, float] = (1.0, 0.5, 2.0, 1.0),
                 negatives: str = "most_violating") -> dict[str, torch.Tensor]:
    """``img[i]``, ``txt[i]`` (B, D) L2-normalised, row i a matching pair; ``pos_mask[i, j]`` True where caption
    j belongs to image i (never a negative). ``weights`` = (i2t cross, i2t intra, t2i cross, t2i intra).

    ``negatives``: ``most_violating`` (released code, DSPE) or ``most_dissimilar`` (the thesis' literal words
    "top N most dissimilar": the N farthest negatives, violating or not; nearly always a zero loss).
    Returns ``loss`` and the four unweighted terms (each already divided by N*B).
    """
    if negatives not in NEGATIVE_SELECTIONS:
        raise ValueError(f"negatives must be one of {NEGATIVE_SELECTIONS}, got {negatives!r}")
    b = img.shape[0]
    if pos_mask is None:
        pos_mask = torch.eye(b, dtype=torch.bool, device=img.device)
    d_it = -(img @ txt.t())      # d_it[i, j] = d(x_i, y_j)
    d_ti = d_it.t()              # d_ti[i, j] = d(x_j, y_i): caption anchor i, image j
    d_tt = -(txt @ txt.t())
    d_ii = -(img @ img.t())
    pos = d_it.diagonal()[:, None]  # d(x_i, y_i)
    neg_i2t = ~pos_mask             # caption j is a negative for image i
    neg_t2i = ~pos_mask.t()         # image j is a negative for caption i
    with torch.no_grad():  # selection only; the hinges below carry the gradient
        if negatives == "most_violating":
            sel_i2t = _select(d_it, neg_i2t & (pos - d_it + margin > 0), n_neg, largest=False)
            sel_t2i = _select(d_ti, neg_t2i & (pos - d_ti + margin > 0), n_neg, largest=False)
        else:
            sel_i2t = _select(d_it, neg_i2t, n_neg, largest=True)
            sel_t2i = _select(d_ti, neg_t2i, n_neg, largest=True)
    norm = n_neg * b
    terms = {
        "i2t_cross": ((pos - d_it + margin).clamp(min=0) * sel_i2t).sum() / norm,
        "i2t_intra": ((pos - d_tt + margin).clamp(min=0) * sel_i2t).sum() / norm,
        "t2i_cross": ((pos - d_ti + margin).clamp(min=0) * sel_t2i).sum() / norm,
        "t2i_intra": ((pos - d_ii + margin).clamp(min=0) * sel_t2i).sum() / norm,
    }
    w1, w2, w3, w4 = weights
    loss = w1 * terms["i2t_cross"] + w2 * terms["i2t_intra"] + w3 * terms["t2i_cross"] + w4 * terms["t2i_intra"]
    return {"loss": loss, **terms}
