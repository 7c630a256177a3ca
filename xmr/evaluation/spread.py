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

from xmr.core.lazy import is_tensor, torch  # the spread is NumPy's work: `xmr test` on a saved matrix needs no torch


def similarity_spread(sims, captions_per_image: int) -> dict[str, float]:
    """Mean, std, min, max and the margins of ``sims`` (NumPy or a tensor), in float64."""
    s = (sims.detach().cpu().numpy() if is_tensor(sims) else np.asarray(sims)).astype(np.float64)
    n_img, n_cap = s.shape
    pos = (np.arange(n_cap) // captions_per_image)[None, :] == np.arange(n_img)[:, None]  # (images, captions)
    best_pos_i = np.where(pos, s, -np.inf).max(1, initial=-np.inf)
    hard_neg_i = np.where(pos, -np.inf, s).max(1, initial=-np.inf)
    best_pos_t = np.where(pos, s, -np.inf).max(0, initial=-np.inf)  # one positive per caption: its image
    hard_neg_t = np.where(pos, -np.inf, s).max(0, initial=-np.inf)
    margin_i2t = float((best_pos_i - hard_neg_i).mean())
    margin_t2i = float((best_pos_t - hard_neg_t).mean())
    return {"mean": float(s.mean()), "std": float(s.std()), "min": float(s.min()), "max": float(s.max()),
            "margin_i2t": margin_i2t, "margin_t2i": margin_t2i, "margin": (margin_i2t + margin_t2i) / 2}


def in_batch_top1(sims, captions_per_image: int, batch: int, batches: int = 20,
                  seed: int = 0) -> float:
    """How often a model ranks the positive first inside a training-sized batch, measured on a scored matrix: draw
    ``batch`` distinct images and one caption of each (``batches`` times, seeded), and count the pairs whose score
    is strictly the largest of its row and of its column in that B × B block (ties count as misses, so a collapsed
    matrix gives 0). Below ~0.5 the hardest-negative loss is lowered by contracting the matrix
    (docs/benchmark.md "Convergence")."""
    s = sims if is_tensor(sims) else torch.as_tensor(np.asarray(sims))
    n_img = s.shape[0]
    if batch > n_img:
        raise ValueError(f"in_batch_top1: batch {batch} is larger than the {n_img} images of the matrix")
    gen = torch.Generator().manual_seed(seed)
    hits = 0.0
    for _ in range(batches):
        imgs = torch.randperm(n_img, generator=gen)[:batch]
        caps = imgs * captions_per_image + torch.randint(captions_per_image, (batch,), generator=gen)
        block = s[imgs][:, caps]
        diag = block.diagonal()
        off = block.masked_fill(torch.eye(batch, dtype=torch.bool), -torch.inf)
        hits += ((diag > off.max(1).values) & (diag > off.max(0).values)).float().mean().item()
    return hits / batches
