"""Bidirectional hinge (triplet) ranking loss of VSE++: hardest negative (``max_violation``) or sum of hinges.

Reductions (``loss.reduction``), per direction (image->text, text->image), then the two added:

- ``sum``: the sum over anchors (VSE++, VSE∞, DVSE);
- ``mean``: the sum divided by the batch size B (the mean over anchors);
- ``mean_pairs``: PVSE's ``loss.mean()`` of the hinge tensor: with summed hinges the mean over all B x B
  entries, the zeroed positives included (yalesong/pvse ``PVSELoss.triplet_ranking_loss``); with the hardest
  negative the mean over the B anchors;
- ``mean_negatives``: DivE's ``loss.mean()`` over the (anchor, negative) hinges (kdwonn/DivE
  ``AsymmetricTripletLoss``: positives are cut out before the mean), i.e. divided by the number of negatives,
  ``(~pos_mask).sum()`` (B x (B - 1) with one positive per anchor, fewer with several); with the hardest negative
  the mean over anchors.

With the hardest negative the three means coincide; with summed hinges they differ by a factor of about B,
which is a factor on the effective learning rate.
"""

from __future__ import annotations

import torch

REDUCTIONS = ("sum", "mean", "mean_pairs", "mean_negatives")


def triplet_loss(sims: torch.Tensor, pos_mask: torch.Tensor | None = None, margin: float = 0.2,
                 max_violation: bool = True, reduction: str = "sum") -> torch.Tensor:
    """``sims[i, j]`` = s(image i, caption j) for a batch of matching pairs on the diagonal.

    ``pos_mask[i, j]`` marks other true pairs (captions of the same image) so they are not used as negatives
    (the reference code uses only the diagonal; ``mean_pairs`` keeps PVSE's B x B denominator, ``mean_negatives``
    counts the negatives the mask leaves, as DivE's mean over its (anchor, negative) pairs).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"loss.reduction: {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    b = sims.shape[0]
    diag = sims.diagonal()
    if pos_mask is None:
        pos_mask = torch.eye(b, dtype=torch.bool, device=sims.device)
    cost_cap = (margin + sims - diag[:, None]).clamp(min=0).masked_fill(pos_mask, 0)  # image anchor, caption negatives
    cost_img = (margin + sims - diag[None, :]).clamp(min=0).masked_fill(pos_mask, 0)  # caption anchor, image negatives
    if max_violation:
        cost_cap, cost_img = cost_cap.max(1).values, cost_img.max(0).values
    total = cost_cap.sum() + cost_img.sum()
    if reduction == "sum":
        return total
    if reduction == "mean" or max_violation:
        return total / b
    if reduction == "mean_pairs":
        return total / (b * b)
    # the same count in both directions: the False entries of the mask, each a negative of its row and its column
    return total / (~pos_mask).sum().clamp(min=1)
