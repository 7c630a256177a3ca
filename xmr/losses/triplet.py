"""Bidirectional hinge (triplet) ranking loss of VSE++: hardest negative (``max_violation``) or sum of hinges."""

from __future__ import annotations

import torch


def triplet_loss(sims: torch.Tensor, pos_mask: torch.Tensor | None = None, margin: float = 0.2,
                 max_violation: bool = True, reduction: str = "sum") -> torch.Tensor:
    """``sims[i, j]`` = s(image i, caption j) for a batch of matching pairs on the diagonal.

    ``pos_mask[i, j]`` marks other true pairs (captions of the same image) so they are not used as negatives
    (the reference code uses only the diagonal). Returns the sum (VSE++) or mean over anchors of
    image->text and text->image hinges.
    """
    b = sims.shape[0]
    diag = sims.diagonal()
    if pos_mask is None:
        pos_mask = torch.eye(b, dtype=torch.bool, device=sims.device)
    cost_cap = (margin + sims - diag[:, None]).clamp(min=0).masked_fill(pos_mask, 0)  # image anchor, caption negatives
    cost_img = (margin + sims - diag[None, :]).clamp(min=0).masked_fill(pos_mask, 0)  # caption anchor, image negatives
    if max_violation:
        cost_cap, cost_img = cost_cap.max(1).values, cost_img.max(0).values
    total = cost_cap.sum() + cost_img.sum()
    return total / b if reduction == "mean" else total
