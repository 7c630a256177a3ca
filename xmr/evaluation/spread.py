"""The spread of a similarity matrix: how far a trained model is from the collapsed solution, where every
similarity is (nearly) the same and retrieval is decided by noise.

``similarity_spread(sims, captions_per_image)`` (rows = images, columns = captions; caption j belongs to image
j // captions_per_image) gives the mean and std of all similarities, their range, and the *margin*: per query the
score of its best positive minus the score of its hardest negative (> 0 exactly when the query's R@1 is a hit),
averaged over image queries (``margin_i2t``), over caption queries (``margin_t2i``) and their mean (``margin``).
A margin near 0 next to a std near 0 is a collapsed run.
"""

from __future__ import annotations

import numpy as np
import torch


def similarity_spread(sims: np.ndarray | torch.Tensor, captions_per_image: int) -> dict[str, float]:
    s = torch.as_tensor(np.asarray(sims) if not torch.is_tensor(sims) else sims).to(torch.float64)
    n_img, n_cap = s.shape
    owner = torch.arange(n_cap) // captions_per_image
    pos = owner[None, :] == torch.arange(n_img)[:, None]  # (images, captions)
    neg_inf = torch.tensor(-torch.inf, dtype=s.dtype)
    best_pos_i = torch.where(pos, s, neg_inf).max(1).values
    hard_neg_i = torch.where(pos, neg_inf, s).max(1).values
    best_pos_t = torch.where(pos, s, neg_inf).max(0).values  # one positive per caption: its image
    hard_neg_t = torch.where(pos, neg_inf, s).max(0).values
    margin_i2t = (best_pos_i - hard_neg_i).mean().item()
    margin_t2i = (best_pos_t - hard_neg_t).mean().item()
    return {"mean": s.mean().item(), "std": s.std(unbiased=False).item(), "min": s.min().item(),
            "max": s.max().item(), "margin_i2t": margin_i2t, "margin_t2i": margin_t2i,
            "margin": (margin_i2t + margin_t2i) / 2}
